//! History benchmark: what one cell's durable row costs the caller.
//!
//! `History::record_committed` awaited for a one-line cell's row, serially
//! (one caller, as the HTTP latency benchmark's client) and from 32
//! concurrent callers (group commit), beside `record` (queued, not
//! waited for) in the same run, blocks interleaved.
//!
//! Usage: cellhost-bench-history [--out FILE]
//! Environment: BENCH_N (4000) rows per path, BENCH_SESSIONS (32),
//! BENCH_PER_SESSION (200) rows each under load.

#[allow(dead_code)]
#[path = "args.rs"]
mod args;
#[allow(dead_code)]
#[path = "stats.rs"]
mod stats;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use args::env_usize;
use cellhost::config::HistoryConfig;
use cellhost::history::{History, HistoryEntry};
use cellhost_protocol::{CellResult, KernelInfo, Status};
use serde_json::json;
use stats::Summary;

const BLOCK: usize = 200;

fn row(session: &str, n: u64) -> HistoryEntry {
    let result = CellResult {
        status: Status::Success,
        stdout: String::new(),
        stderr: String::new(),
        value: None,
        error: None,
        traceback: None,
        hint: None,
        displays: vec![],
        value_display: None,
        truncated: Default::default(),
        tool_calls_made: 0,
        duration_seconds: 0.0001,
        kernel: KernelInfo {
            id: "k-bench".into(),
            execution_count: n,
            ..KernelInfo::default()
        },
    };
    HistoryEntry::of(session, None, "x=1", 1.7e9, &result)
}

async fn bench() -> Result<serde_json::Value> {
    let n = env_usize("BENCH_N", 4000)?;
    let sessions = env_usize("BENCH_SESSIONS", 32)?;
    let per = env_usize("BENCH_PER_SESSION", 200)?;
    let dir = tempfile::tempdir()?;
    let h = Arc::new(History::open(
        &dir.path().join("history.sqlite"),
        &HistoryConfig::default(),
        [],
    )?);
    let (mut committed, mut queued) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut i = 0u64;
    while committed.len() < n {
        for _ in 0..BLOCK.min(n - committed.len()) {
            i += 1;
            let t = Instant::now();
            if !h.record_committed(row("serial", i)).await {
                bail!("a row did not commit: {:?}", h.health());
            }
            committed.push(t.elapsed());
        }
        for _ in 0..BLOCK.min(n - queued.len()) {
            i += 1;
            let t = Instant::now();
            h.record(row("queued", i));
            queued.push(t.elapsed());
        }
        // Let the queued rows commit outside the next block.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let committed = Summary::of(&committed).context("no samples")?;
    let queued = Summary::of(&queued).context("no samples")?;

    let t0 = Instant::now();
    let tasks: Vec<_> = (0..sessions)
        .map(|s| {
            let h = h.clone();
            tokio::spawn(async move {
                let mut v = Vec::with_capacity(per);
                for j in 0..per {
                    let t = Instant::now();
                    if !h.record_committed(row(&format!("c{s}"), j as u64)).await {
                        bail!("a row did not commit: {:?}", h.health());
                    }
                    v.push(t.elapsed());
                }
                Ok(v)
            })
        })
        .collect();
    let mut all = Vec::with_capacity(sessions * per);
    for t in tasks {
        all.extend(t.await??);
    }
    let rows_per_second = (sessions * per) as f64 / t0.elapsed().as_secs_f64();
    let load = Summary::of(&all).context("no samples")?;
    h.close();

    println!("cellhost history benchmark (one-line cell rows, WAL, synchronous=NORMAL)");
    println!(
        "{:<40} {:>10} {:>10} {:>10}",
        "", "p50 µs", "p99 µs", "mean µs"
    );
    for (name, s) in [
        ("record_committed (awaited, serial)", &committed),
        ("record (queued, not waited for)", &queued),
        ("record_committed, concurrent callers", &load),
    ] {
        println!(
            "{name:<40} {:>10.1} {:>10.1} {:>10.1}",
            s.p50, s.p99, s.mean
        );
    }
    println!("{sessions} concurrent callers: {rows_per_second:.0} committed rows/s");
    Ok(json!({
        "n": n,
        "record_committed": committed.to_json(),
        "record": queued.to_json(),
        "concurrent": {
            "callers": sessions,
            "rows_per_caller": per,
            "rows_per_second": rows_per_second.round(),
            "latency": load.to_json(),
        },
    }))
}

fn main() {
    let args = match args::parse("bench/results/history.json") {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cellhost-bench-history: {e:#}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    match rt.block_on(bench()) {
        Ok(v) => {
            if let Err(e) =
                std::fs::write(&args.out, serde_json::to_string_pretty(&v).unwrap() + "\n")
            {
                eprintln!(
                    "cellhost-bench-history: cannot write {}: {e}",
                    args.out.display()
                );
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("cellhost-bench-history: {e:#}");
            std::process::exit(1);
        }
    }
}
