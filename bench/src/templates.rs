//! Warm-template benchmark (issue 23, docs/templates.md), one run, each
//! comparison interleaved in the same run:
//! - a new session's first reply (`x=1`) with no pool: a fork of the warm
//!   template against a plain spawn (target <= 3 ms p50 for a fork);
//! - a new session's first `import pandas; pd.DataFrame({"a": [1]})`:
//!   a template that preloads pandas against a plain spawn without
//!   (target <= 10 ms p50);
//! - the summed PSS of idle kernels with pandas preloaded: forks of a
//!   template against plain spawns (target <= 1/4), per kernel.
//!
//! Usage: cellhost-bench-templates [--python PATH] [--out FILE]
//! Environment: BENCH_SANDBOX=strict for strict kernels (a strict template
//! against bwrap spawns; results in bench/results/templates-strict.json),
//! BENCH_FIRST (30) new sessions per variant, BENCH_PANDAS
//! (10) pandas sessions per variant, BENCH_IDLE (1000) idle template
//! forks, BENCH_IDLE_PLAIN (100) idle plain kernels (each holds its own
//! pandas: 1,000 of them would not fit this machine's memory),
//! BENCH_WORKSPACE_FS=0 for workspaces without volumes of their own (a
//! new session's volume is made on its first reply's path, both ways).

#[path = "args.rs"]
mod args;
#[allow(dead_code)]
#[path = "procfs.rs"]
mod procfs;
#[allow(dead_code)]
#[path = "stats.rs"]
mod stats;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use args::{env_usize, Args};
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::sys::{descendants, parent_pid};
use cellhost::{Cell, KernelOptions};
use procfs::pss_kib;
use serde_json::json;
use stats::Summary;

const PANDAS: &str = "import pandas as pd; pd.DataFrame({'a': [1]})";

/// `BENCH_SANDBOX=strict`: strict kernels (else `none`).
fn strict() -> bool {
    std::env::var("BENCH_SANDBOX").as_deref() == Ok("strict")
}

fn manager(dir: &tempfile::TempDir, python: &PathBuf, templates: bool) -> ManagerOptions {
    let sandbox = if strict() {
        cellhost::Sandbox::strict()
    } else {
        cellhost::Sandbox::None
    };
    ManagerOptions::new(dir.path().join("data"))
        .kernel(
            KernelOptions::default()
                .python(python)
                .runtime_dir(dir.path().join("run"))
                .sandbox(sandbox),
        )
        .idle_timeout(None)
        .warm_pool(0)
        .templates(templates)
        .workspace_fs(std::env::var("BENCH_WORKSPACE_FS").as_deref() != Ok("0"))
}

async fn cell(m: &KernelManager, owner: &str, code: &str) -> Result<Duration> {
    let t = Instant::now();
    let r = m.execute(owner, Cell::new(code)).await?;
    let took = t.elapsed();
    if !r.is_success() {
        bail!("{code:?} failed for {owner}: {:?}", r.error);
    }
    Ok(took)
}

/// New sessions' first `code`, alternating between `a` and `b`, each
/// disposed after; the first of each (a template's start) is not timed.
async fn interleaved(
    (a, b): (&KernelManager, &KernelManager),
    n: usize,
    code: &str,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for i in 0..=n {
        for (m, out) in [(a, &mut ta), (b, &mut tb)] {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let owner = format!("new-{i}");
            let took = cell(m, &owner, code).await?;
            if i > 0 {
                out.push(took);
            }
            m.dispose_owner(&owner).await;
        }
    }
    Ok((ta, tb))
}

/// What `n` idle sessions that imported pandas hold, in MiB: their
/// runners' summed PSS (the template's included where there is one),
/// and the summed PSS of every process the host started (also each
/// kernel's bwrap or namespace init and leader, death watchers,
/// templates, spares); the host's RSS; seconds to start them.
struct Idle {
    pss: f64,
    all_pss: f64,
    host: f64,
    took: f64,
}

async fn idle(m: &KernelManager, n: usize) -> Result<Idle> {
    let t = Instant::now();
    for i in 0..n {
        cell(m, &format!("idle-{i}"), "import pandas as pd").await?;
    }
    let took = t.elapsed().as_secs_f64();
    let list = m.list();
    if list.len() != n {
        bail!("{} kernels listed, {n} expected", list.len());
    }
    let mut pss: u64 = list.iter().filter_map(|k| k.pid.and_then(pss_kib)).sum();
    let pids: Vec<u32> = list.iter().filter_map(|k| k.pid).collect();
    if let Some(template) = pids.first().and_then(|p| template_of(*p)) {
        pss += pss_kib(template).unwrap_or(0);
    }
    let all: u64 = descendants(std::process::id())
        .into_iter()
        .filter_map(pss_kib)
        .sum();
    let host = cellhost::kernel::rss_bytes(std::process::id()).unwrap_or(0);
    Ok(Idle {
        pss: pss as f64 / 1024.0,
        all_pss: all as f64 / 1024.0,
        host: host as f64 / (1024.0 * 1024.0),
        took,
    })
}

/// The template `pid` was forked from (an ancestor named so), if any.
fn template_of(pid: u32) -> Option<u32> {
    let mut p = parent_pid(pid)?;
    while p > 1 && p != std::process::id() {
        let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).ok()?;
        if comm.trim() == "cellhost-tmpl" {
            return Some(p);
        }
        p = parent_pid(p)?;
    }
    None
}

fn ms(s: &Summary) -> serde_json::Value {
    json!({"p50_ms": s.p50 / 1e3, "p95_ms": s.p95 / 1e3, "n": s.n})
}

async fn run(args: &Args) -> Result<()> {
    let first_n = env_usize("BENCH_FIRST", 30)?;
    let pandas_n = env_usize("BENCH_PANDAS", 10)?;
    let idle_n = env_usize("BENCH_IDLE", 1000)?;
    let idle_plain_n = env_usize("BENCH_IDLE_PLAIN", 100)?;
    eprintln!(
        "templates bench: python {}, {} kernels",
        args.python.display(),
        if strict() { "strict" } else { "none" }
    );

    // First replies, no pool, no preload.
    let (da, db) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let forked = KernelManager::start(manager(&da, &args.python, true)).await;
    let plain = KernelManager::start(manager(&db, &args.python, false)).await;
    let (f, p) = interleaved((&forked, &plain), first_n, "x=1").await?;
    if forked.stats().template_forks < first_n as u64 {
        bail!(
            "only {} forks from the template",
            forked.stats().template_forks
        );
    }
    forked.shutdown().await;
    plain.shutdown().await;
    let (f, p) = (
        Summary::of(&f).context("no samples")?,
        Summary::of(&p).context("no samples")?,
    );
    println!(
        "new session → first reply, template fork p50 {:>8.2} ms, plain spawn {:>8.2} ms: {:.2}x (target <= 3 ms)",
        f.p50 / 1e3,
        p.p50 / 1e3,
        f.p50 / p.p50
    );

    // First pandas cell: a template preloading pandas, against a plain
    // spawn without.
    let (dc, dd) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let preloading =
        KernelManager::start(manager(&dc, &args.python, true).preload(vec!["pandas".into()])).await;
    let bare = KernelManager::start(manager(&dd, &args.python, false)).await;
    let (pf, pp) = interleaved((&preloading, &bare), pandas_n, PANDAS).await?;
    preloading.shutdown().await;
    bare.shutdown().await;
    let (pf, pp) = (
        Summary::of(&pf).context("no samples")?,
        Summary::of(&pp).context("no samples")?,
    );
    println!(
        "new session's first pandas cell, preloading template p50 {:>8.2} ms, plain spawn {:>8.2} ms: {:.3}x (target <= 10 ms)",
        pf.p50 / 1e3,
        pp.p50 / 1e3,
        pf.p50 / pp.p50
    );

    // Idle kernels with pandas: template forks against plain spawns.
    let de = tempfile::tempdir()?;
    let many = KernelManager::start(
        manager(&de, &args.python, true)
            .preload(vec!["pandas".into()])
            .max_kernels(idle_n + 1),
    )
    .await;
    let ti = idle(&many, idle_n).await?;
    many.shutdown().await;
    let df = tempfile::tempdir()?;
    let few = KernelManager::start(
        manager(&df, &args.python, false)
            .preload(vec!["pandas".into()])
            .max_kernels(idle_plain_n + 1),
    )
    .await;
    let pi = idle(&few, idle_plain_n).await?;
    few.shutdown().await;
    let (t_each, p_each) = (ti.pss / idle_n as f64, pi.pss / idle_plain_n as f64);
    let (t_all, p_all) = (ti.all_pss / idle_n as f64, pi.all_pss / idle_plain_n as f64);
    println!(
        "{idle_n} idle forks with pandas: summed PSS {:.0} MiB ({t_each:.2} MiB each, template included; {t_all:.2} MiB each with every process), host RSS {:.1} MiB, started in {:.1} s",
        ti.pss, ti.host, ti.took
    );
    println!(
        "{idle_plain_n} idle plain kernels with pandas: summed PSS {:.0} MiB ({p_each:.2} MiB each; {p_all:.2} MiB each with every process), host RSS {:.1} MiB, started in {:.1} s",
        pi.pss, pi.host, pi.took
    );
    println!(
        "  PSS per kernel, fork / plain: {:.3}x, with every process {:.3}x (target <= 0.25x)",
        t_each / p_each,
        t_all / p_all
    );

    let figures = json!({
        "python": args.python,
        "sandbox": if strict() { "strict" } else { "none" },
        "first_reply_template": ms(&f),
        "first_reply_plain": ms(&p),
        "ratio_first_reply_template_to_plain": f.p50 / p.p50,
        "first_pandas_preloading_template": ms(&pf),
        "first_pandas_plain": ms(&pp),
        "ratio_first_pandas_template_to_plain": pf.p50 / pp.p50,
        "idle_forks": idle_n,
        "idle_forks_pss_mib": ti.pss,
        "idle_forks_all_processes_pss_mib": ti.all_pss,
        "idle_forks_host_rss_mib": ti.host,
        "idle_forks_seconds": ti.took,
        "idle_plain": idle_plain_n,
        "idle_plain_pss_mib": pi.pss,
        "idle_plain_all_processes_pss_mib": pi.all_pss,
        "idle_plain_host_rss_mib": pi.host,
        "idle_plain_seconds": pi.took,
        "ratio_pss_each_fork_to_plain": t_each / p_each,
        "ratio_all_processes_pss_each_fork_to_plain": t_all / p_all,
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
    let out = if strict() {
        "bench/results/templates-strict.json"
    } else {
        "bench/results/templates.json"
    };
    let args = match args::parse(out) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cellhost-bench-templates: {e:#}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(run(&args)) {
        eprintln!("cellhost-bench-templates: could not run: {e:#}");
        std::process::exit(1);
    }
}
