//! MCP benchmark: the `execute_code` round trip for a trivial cell over
//! stdio (`cellhost mcp`, driven by the official Rust SDK's client), beside
//! the same cell through the library (`KernelManager::execute`) in the
//! same run, and an MCP floor: a tool call that runs no cell
//! (`interrupt` with nothing running). Then the same over `/mcp`
//! (streamable HTTP) of a `cellhost serve` child, beside `/v1/.../execute`
//! on that daemon (see `mcp_http`). The paths take turns in blocks of 100
//! so drift on a noisy machine hits them alike.
//!
//! Usage: cellhost-bench-mcp [--python PATH] [--out FILE]
//! Environment: BENCH_CELLHOST (the `cellhost` binary; default: next to
//! this one), BENCH_N (2000) cells per path, BENCH_WARMUP (200).

#[path = "args.rs"]
mod args;
#[path = "mcp_http.rs"]
mod mcp_http;
#[allow(dead_code)]
#[path = "stats.rs"]
mod stats;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use args::env_usize;
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::{Cell, KernelOptions, Status};
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::json;
use stats::Summary;

const BLOCK: usize = 100;

type Client = RunningService<RoleClient, ()>;

async fn mcp_call(c: &Client, tool: &'static str, args: serde_json::Value) -> Result<()> {
    let serde_json::Value::Object(args) = args else {
        bail!("arguments must be an object");
    };
    let r = c
        .call_tool(CallToolRequestParams::new(tool).with_arguments(args))
        .await?;
    if r.is_error == Some(true) {
        bail!("{tool} failed: {:?}", r.content);
    }
    Ok(())
}

async fn lib_cell(m: &KernelManager) -> Result<()> {
    let r = m.execute("lib", Cell::new("x=1")).await?;
    if r.status != Status::Success {
        bail!("library cell ended {}", r.status.as_str());
    }
    Ok(())
}

fn cellhost_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("BENCH_CELLHOST") {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe()?;
    let p = me.with_file_name("cellhost");
    if !p.exists() {
        bail!(
            "{} is missing: build it (cargo build --release -p cellhost-cli) or set BENCH_CELLHOST",
            p.display()
        );
    }
    Ok(p)
}

type Times = Vec<Duration>;

/// One block of the `/mcp` paths on a blocking thread: `count` round
/// trips each of `execute_code`, the `interrupt` floor and `/v1` execute.
async fn web_block(
    mut c: mcp_http::Lean,
    id: &mut u64,
    count: usize,
) -> Result<(mcp_http::Lean, Times, Times, Times)> {
    let first = *id;
    *id += 2 * count as u64;
    tokio::task::spawn_blocking(move || {
        let (mut e, mut f, mut v1) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..count as u64 {
            let t = Instant::now();
            c.call(first + i + 1, "execute_code", &json!({"code": "x=1"}))?;
            e.push(t.elapsed());
        }
        for i in 0..count as u64 {
            let t = Instant::now();
            c.call(first + count as u64 + i + 1, "interrupt", &json!({}))?;
            f.push(t.elapsed());
        }
        for _ in 0..count {
            let t = Instant::now();
            c.execute("v1")?;
            v1.push(t.elapsed());
        }
        Ok((c, e, f, v1))
    })
    .await?
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let args = args::parse("bench/results/mcp.json")?;
    let n = env_usize("BENCH_N", 2000)?;
    let warmup = env_usize("BENCH_WARMUP", 200)?;
    let data = tempfile::tempdir()?;

    let mut cmd = tokio::process::Command::new(cellhost_binary()?);
    cmd.args(["mcp", "--sandbox", "none", "--python"])
        .arg(&args.python)
        .arg("--data-dir")
        .arg(data.path().join("mcp"))
        .stderr(std::process::Stdio::null());
    let client: Client = ().serve(TokioChildProcess::new(cmd)?).await?;

    let manager = KernelManager::start(ManagerOptions::new(data.path().join("lib")).kernel(
        KernelOptions {
            python: Some(args.python.clone()),
            ..KernelOptions::default()
        },
    ))
    .await;

    let daemon = mcp_http::Daemon::start(
        &cellhost_binary()?,
        &args.python,
        &data.path().join("serve"),
    )?;
    let mut web = mcp_http::Lean::connect(daemon.addr)?;
    web.initialize().context("an MCP session over /mcp")?;
    let mut id = 0u64;
    let exec = || mcp_call(&client, "execute_code", json!({"code": "x=1"}));
    let floor = || mcp_call(&client, "interrupt", json!({}));
    for _ in 0..warmup {
        exec().await.context("warm-up over MCP")?;
        lib_cell(&manager).await.context("warm-up in the library")?;
        floor().await?;
    }
    let (c, ..) = web_block(web, &mut id, warmup)
        .await
        .context("warm-up over /mcp")?;
    web = c;
    let (mut over_mcp, mut direct, mut floors) = (Vec::new(), Vec::new(), Vec::new());
    let (mut over_web, mut web_floors, mut over_v1) = (Vec::new(), Vec::new(), Vec::new());
    while over_mcp.len() < n {
        let (c, e, f, v1) = web_block(web, &mut id, BLOCK).await?;
        web = c;
        over_web.extend(e);
        web_floors.extend(f);
        over_v1.extend(v1);
        for _ in 0..BLOCK {
            let t = Instant::now();
            exec().await?;
            over_mcp.push(t.elapsed());
        }
        for _ in 0..BLOCK {
            let t = Instant::now();
            lib_cell(&manager).await?;
            direct.push(t.elapsed());
        }
        for _ in 0..BLOCK {
            let t = Instant::now();
            floor().await?;
            floors.push(t.elapsed());
        }
    }
    let summary = |v: &[Duration]| Summary::of(v).context("no samples");
    let (m, l, f) = (summary(&over_mcp)?, summary(&direct)?, summary(&floors)?);
    let (w, wf, v1) = (
        summary(&over_web)?,
        summary(&web_floors)?,
        summary(&over_v1)?,
    );
    println!(
        "{:<40} {:>8} {:>8} {:>8}",
        "warm x=1, µs", "p50", "p99", "max"
    );
    for (name, s) in [
        ("MCP execute_code over stdio", m),
        ("library KernelManager::execute", l),
        ("MCP floor: interrupt (no cell)", f),
        ("MCP execute_code over /mcp", w),
        ("/mcp floor: interrupt (no cell)", wf),
        ("HTTP /v1 execute, same daemon", v1),
    ] {
        println!("{name:<40} {:>8.1} {:>8.1} {:>8.1}", s.p50, s.p99, s.max);
    }
    println!(
        "MCP - library p50: +{:.1} µs ({:.2}x; target <= +150 µs: {})",
        m.p50 - l.p50,
        m.p50 / l.p50,
        if m.p50 - l.p50 <= 150.0 {
            "met"
        } else {
            "MISSED"
        }
    );
    println!(
        "/mcp - library p50: +{:.1} µs; /mcp - /v1 execute p50: +{:.1} µs",
        w.p50 - l.p50,
        w.p50 - v1.p50
    );
    let report = json!({
        "mcp_http_execute_us": w.to_json(), "mcp_http_floor_us": wf.to_json(),
        "v1_execute_same_daemon_us": v1.to_json(),
        "mcp_http_minus_library_p50_us": w.p50 - l.p50,
        "mcp_http_minus_v1_p50_us": w.p50 - v1.p50,
        "cells_per_path": over_mcp.len(),
        "mcp_execute_us": m.to_json(), "library_us": l.to_json(), "mcp_floor_us": f.to_json(),
        "mcp_minus_library_p50_us": m.p50 - l.p50,
        "target_met": m.p50 - l.p50 <= 150.0,
        "load": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    });
    manager.shutdown().await;
    client.cancel().await?;
    drop(daemon);
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)?;
    Ok(())
}
