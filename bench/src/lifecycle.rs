//! Lifecycle benchmark: a new session's first cell with and without the
//! warm pool, as ratios to a warm cell in the same run; and 500 live idle
//! kernels under one manager, with the host's RSS and the kernels' summed
//! PSS.
//!
//! Usage: cellhost-bench-lifecycle [--python PATH] [--out FILE]
//! Environment: BENCH_N (1000) warm cells, BENCH_FIRST (30) new sessions
//! per variant, BENCH_IDLE (500) idle kernels.

#[path = "args.rs"]
mod args;
#[allow(dead_code)]
#[path = "stats.rs"]
mod stats;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use args::{env_usize, Args};
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::{Cell, KernelOptions};
use serde_json::json;
use stats::Summary;

fn manager_options(dir: &tempfile::TempDir, python: &PathBuf) -> ManagerOptions {
    ManagerOptions::new(dir.path().join("data"))
        .kernel(
            KernelOptions::default()
                .python(python)
                .runtime_dir(dir.path().join("run")),
        )
        .idle_timeout(None)
}

async fn x1(m: &KernelManager, owner: &str) -> Result<Duration> {
    let t = Instant::now();
    let r = m.execute(owner, Cell::new("x=1")).await?;
    let took = t.elapsed();
    if !r.is_success() {
        bail!("x=1 failed for {owner}: {:?}", r.error);
    }
    Ok(took)
}

/// Idle time before every timed cell of the first-cell comparison: a new
/// session's first cell arrives after the host sat idle, and a cell after
/// idle costs more than one in a tight loop (wake-ups, cold caches) on any
/// kernel, new or not. So the reference is a warm session's cell after the
/// same gap, interleaved with the new sessions.
const GAP: Duration = Duration::from_millis(50);

/// First-cell latency of `n` new sessions, one after another, each paired
/// with a cell of the warm session `warm` after the same idle gap. With a
/// pool, each new session arrives once the pool has refilled.
async fn first_cells(
    m: &KernelManager,
    n: usize,
    pooled: usize,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let mut firsts = Vec::with_capacity(n);
    let mut warm = Vec::with_capacity(n);
    x1(m, "warm").await?;
    for i in 0..n {
        let ready = Instant::now();
        while m.pooled() < pooled {
            if ready.elapsed() > Duration::from_secs(30) {
                bail!("the warm pool did not refill within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(GAP).await;
        warm.push(x1(m, "warm").await?);
        tokio::time::sleep(GAP).await;
        let owner = format!("new-{i}");
        firsts.push(x1(m, &owner).await?);
        m.dispose_owner(&owner).await;
    }
    Ok((firsts, warm))
}

fn pss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Pss:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn ms(s: &Summary) -> serde_json::Value {
    json!({"p50_ms": s.p50 / 1e3, "p95_ms": s.p95 / 1e3, "n": s.n})
}

async fn run(args: &Args) -> Result<()> {
    let n = env_usize("BENCH_N", 1000)?;
    let first_n = env_usize("BENCH_FIRST", 30)?;
    let idle_n = env_usize("BENCH_IDLE", 500)?;
    eprintln!("lifecycle bench: python {}", args.python.display());

    // Warm cell and first cells without a pool, on one manager.
    let dir = tempfile::tempdir()?;
    let plain = KernelManager::start(manager_options(&dir, &args.python).warm_pool(0)).await;
    for _ in 0..100 {
        x1(&plain, "warm").await?;
    }
    let mut warm = Vec::with_capacity(n);
    for _ in 0..n {
        warm.push(x1(&plain, "warm").await?);
    }
    let (cold, _) = first_cells(&plain, first_n, 0).await?;
    plain.shutdown().await;

    let dir = tempfile::tempdir()?;
    let pool = KernelManager::start(manager_options(&dir, &args.python).warm_pool(2)).await;
    let (pooled, after_gap) = first_cells(&pool, first_n, 2).await?;
    let hits = pool.stats().pool_hits;
    pool.shutdown().await;
    if hits < first_n as u64 {
        bail!("only {hits} of {first_n} first cells were served by the pool");
    }

    let warm = Summary::of(&warm).context("no warm samples")?;
    let cold = Summary::of(&cold).context("no samples")?;
    let pooled = Summary::of(&pooled).context("no samples")?;
    let after_gap = Summary::of(&after_gap).context("no samples")?;
    println!(
        "warm cell x=1, tight loop    p50 {:>9.3} ms",
        warm.p50 / 1e3
    );
    println!(
        "warm cell x=1, after {} ms idle p50 {:>9.3} ms  (the reference below)",
        GAP.as_millis(),
        after_gap.p50 / 1e3
    );
    println!(
        "new session, no pool        p50 {:>9.3} ms  = {:>6.1}x warm-after-idle",
        cold.p50 / 1e3,
        cold.p50 / after_gap.p50
    );
    println!(
        "new session, warm pool      p50 {:>9.3} ms  = {:>6.1}x warm-after-idle (target <= 3x), {:.1}x tight-loop warm",
        pooled.p50 / 1e3,
        pooled.p50 / after_gap.p50,
        pooled.p50 / warm.p50
    );

    // Many idle kernels under one manager.
    let dir = tempfile::tempdir()?;
    let many = KernelManager::start(
        manager_options(&dir, &args.python)
            .warm_pool(0)
            .max_kernels(idle_n + 1),
    )
    .await;
    let rss_before = cellhost::kernel::rss_bytes(std::process::id()).unwrap_or(0);
    let t = Instant::now();
    for i in 0..idle_n {
        x1(&many, &format!("idle-{i}")).await?;
    }
    let spawn_all = t.elapsed();
    let list = many.list();
    if list.len() != idle_n {
        bail!("{} kernels listed, {idle_n} expected", list.len());
    }
    let host_rss = cellhost::kernel::rss_bytes(std::process::id()).unwrap_or(0);
    let pss: u64 = list
        .iter()
        .filter_map(|k| k.pid.and_then(pss_kib))
        .sum::<u64>();
    let rss: u64 = list.iter().filter_map(|k| k.rss_bytes).sum();
    let t = Instant::now();
    many.shutdown().await;
    let shutdown = t.elapsed();
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "{idle_n} idle kernels: host RSS {:.1} MiB (was {:.1} MiB; target < 64), kernels' PSS {:.0} MiB ({:.2} MiB each; RSS {:.1} MiB each)",
        mib(host_rss),
        mib(rss_before),
        pss as f64 / 1024.0,
        pss as f64 / 1024.0 / idle_n as f64,
        mib(rss) / idle_n as f64,
    );
    println!(
        "  started one after another in {:.1} s, all shut down in {:.2} s",
        spawn_all.as_secs_f64(),
        shutdown.as_secs_f64()
    );

    let figures = json!({
        "python": args.python,
        "warm_tight_loop": ms(&warm),
        "warm_after_idle_gap": ms(&after_gap),
        "idle_gap_ms": GAP.as_millis() as u64,
        "first_cell_no_pool": ms(&cold),
        "first_cell_pool": ms(&pooled),
        "ratio_no_pool_to_warm_after_gap": cold.p50 / after_gap.p50,
        "ratio_pool_to_warm_after_gap": pooled.p50 / after_gap.p50,
        "ratio_pool_to_warm_tight_loop": pooled.p50 / warm.p50,
        "idle_kernels": idle_n,
        "host_rss_mib": mib(host_rss),
        "kernels_pss_mib": pss as f64 / 1024.0,
        "kernel_pss_mib_each": pss as f64 / 1024.0 / idle_n as f64,
        "spawn_all_seconds": spawn_all.as_secs_f64(),
        "shutdown_seconds": shutdown.as_secs_f64(),
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
    let args = match args::parse("bench/results/lifecycle.json") {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cellhost-bench-lifecycle: {e:#}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(&args)) {
        eprintln!("cellhost-bench-lifecycle: could not run: {e:#}");
        std::process::exit(1);
    }
}
