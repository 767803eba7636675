//! Tool RPC benchmark: the round trip of a no-op tool (cell → Rust tool →
//! cell), timed inside the cell for each of 1,000 calls in one cell, beside
//! the floor: the same Python client doing the same framed exchange with a
//! bare Rust echo server on a Unix socket (no token, JSON dispatch,
//! authority or task). Also the warm `x=1` cell with and without a tool
//! set attached, interleaved, to show the authority costs a cell nothing.
//!
//! Usage: cellhost-bench-tools [--python PATH] [--out FILE]
//! Environment: BENCH_CALLS (1000) calls per cell, BENCH_ROUNDS (5) cells
//! per variant, BENCH_N (2000) warm cells per variant.

#[path = "args.rs"]
mod args;
#[allow(dead_code)]
#[path = "stats.rs"]
mod stats;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use args::env_usize;
use cellhost::tools::{FnTool, ToolSet};
use cellhost::{Cell, Kernel, KernelOptions};
use serde_json::{json, Value};
use stats::Summary;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The cell: `calls` timed calls of `fn()`, the times in ns as a list.
fn timed_calls(call: &str, calls: usize) -> String {
    format!(
        "import time\n_t = []\n_pc = time.perf_counter_ns\nfor _i in range({calls}):\n    _a = _pc()\n    {call}\n    _t.append(_pc() - _a)\n_t"
    )
}

/// A framed echo server: reads a frame, answers `{"result": null}`.
async fn echo_server(path: PathBuf) -> Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::UnixListener::bind(&path)?;
    Ok(tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let reply = br#"{"result": null}"#;
                let mut frame = (reply.len() as u32).to_le_bytes().to_vec();
                frame.extend_from_slice(reply);
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let mut head = [0u8; 4];
                    if s.read_exact(&mut head).await.is_err() {
                        return;
                    }
                    let n = u32::from_le_bytes(head) as usize;
                    buf.resize(n, 0);
                    if s.read_exact(&mut buf).await.is_err() || s.write_all(&frame).await.is_err() {
                        return;
                    }
                }
            });
        }
    }))
}

fn parse_ns(value: Option<&str>) -> Result<Vec<f64>> {
    let v: Vec<f64> = serde_json::from_str(value.context("the cell returned no value")?)?;
    Ok(v.into_iter().map(|ns| ns / 1000.0).collect())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args::Args { python, out } = args::parse("bench/results/tools.json")?;
    let calls = env_usize("BENCH_CALLS", 1000)?;
    let rounds = env_usize("BENCH_ROUNDS", 5)?;
    let warm = env_usize("BENCH_N", 2000)?;

    let dir = tempfile::tempdir()?;
    let opts = KernelOptions::default()
        .python(&python)
        .runtime_dir(dir.path().join("run"));
    let kernel = Kernel::spawn(opts).await?;
    let noop = FnTool::new("noop", "Does nothing.", json!({}), |_| {
        std::future::ready(Ok(Value::Null))
    });
    let tools = ToolSet::new().with(noop)?;
    let echo_path = dir.path().join("echo.sock");
    let _echo = echo_server(echo_path.clone()).await?;

    // Set up the floor client in the kernel: the tools module's own
    // exchange, pointed at the echo server.
    let setup = format!(
        "import tools, socket, json\n_s = socket.socket(socket.AF_UNIX)\n_s.connect({:?})\n_frame = lambda: tools._exchange(_s, (lambda b: len(b).to_bytes(4, 'little') + b)(json.dumps({{'token': tools._TOKEN, 'tool': 'noop', 'args': {{}}}}).encode()))\ntools.noop()",
        echo_path.to_str().context("a UTF-8 temp path")?
    );
    let r = kernel
        .execute(Cell::new(setup).tools(tools.clone()))
        .await?;
    if r.error.is_some() {
        bail!("setup cell failed: {:?} {:?}", r.error, r.traceback);
    }
    let floor_cell = timed_calls("json.loads(_frame())", calls);
    let tool_cell = timed_calls("tools.noop()", calls);
    let (mut floor, mut rpc) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (code, sink) in [(&tool_cell, &mut rpc), (&floor_cell, &mut floor)] {
            let r = kernel
                .execute(
                    Cell::new(code.clone())
                        .tools(tools.clone())
                        .max_tool_calls(calls as u32),
                )
                .await?;
            if r.error.is_some() {
                bail!("benchmark cell failed: {:?}", r.error);
            }
            sink.extend(parse_ns(r.value.as_deref())?);
        }
    }
    let rpc = Summary::of_micros(&mut rpc).context("no samples")?;
    let floor = Summary::of_micros(&mut floor).context("no samples")?;

    // Warm x=1 with and without tools attached, interleaved.
    let (mut plain, mut with) = (Vec::new(), Vec::new());
    for i in 0..warm + 200 {
        let t = Instant::now();
        let cell = if i % 2 == 0 {
            Cell::new("x=1")
        } else {
            Cell::new("x=1").tools(tools.clone())
        };
        kernel.execute(cell).await?;
        let d = t.elapsed();
        if i >= 200 {
            if i % 2 == 0 { &mut plain } else { &mut with }.push(d);
        }
    }
    let plain = Summary::of(&plain).context("no samples")?;
    let with = Summary::of(&with).context("no samples")?;
    kernel.shutdown().await;

    println!("tool RPC round trip, no-op tool, {calls} calls per cell x {rounds} cells (µs, timed in the cell)");
    println!("{:<34} {:>8} {:>8} {:>8}", "", "p50", "p99", "max");
    println!(
        "{:<34} {:>8.1} {:>8.1} {:>8.1}",
        "cellhost tools.noop()", rpc.p50, rpc.p99, rpc.max
    );
    println!(
        "{:<34} {:>8.1} {:>8.1} {:>8.1}",
        "floor: framed echo, same client", floor.p50, floor.p99, floor.max
    );
    println!(
        "ratio p50 cellhost / floor: {:.2}x; target p50 <= 100 µs: {}",
        rpc.p50 / floor.p50,
        if rpc.p50 <= 100.0 { "met" } else { "MISSED" }
    );
    println!(
        "warm x=1 p50: {:.1} µs plain, {:.1} µs with a tool set ({:.2}x)",
        plain.p50,
        with.p50,
        with.p50 / plain.p50
    );
    let report = json!({
        "calls_per_cell": calls, "cells": rounds,
        "rpc_us": rpc.to_json(), "floor_us": floor.to_json(),
        "warm_plain_us": plain.to_json(), "warm_with_tools_us": with.to_json(),
        "load": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    });
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report)?)?;
    Ok(())
}
