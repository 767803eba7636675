//! Load run: 64 concurrent clients (one session and one keep-alive
//! connection each) send small cells to a real `cellhost serve` for 60 s.
//! Reports throughput, p50/p99 latency, errors, and history rows lost
//! (answered cells missing from the history after a graceful stop).
//! Exits 1 on any error or lost row.
//!
//! Usage: cellhost-bench-load [--clients 64] [--seconds 60]
//!        [--sandbox strict|none] [--cellhost PATH] [--out bench/results/load.json]

#[allow(dead_code)]
#[path = "procfs.rs"]
mod procfs;
#[allow(dead_code)]
#[path = "reliability/mod.rs"]
mod reliability;
#[allow(dead_code)]
#[path = "stats.rs"]
mod stats;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reliability::client::Conn;
use reliability::daemon::DaemonSetup;
use serde_json::json;

fn main() -> Result<()> {
    let (mut clients, mut seconds, mut sandbox) = (64usize, 60u64, "strict".to_owned());
    let (mut bin, mut out) = (None, PathBuf::from("bench/results/load.json"));
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--clients" => clients = val()?.parse()?,
            "--seconds" => seconds = val()?.parse()?,
            "--sandbox" => sandbox = val()?,
            "--cellhost" => bin = Some(PathBuf::from(val()?)),
            "--out" => out = val()?.into(),
            other => {
                bail!("unknown argument {other}; see the usage at the top of bench/src/load.rs")
            }
        }
    }
    let bin = reliability::cellhost_bin(bin)?;
    // Every client keeps its kernel: the cap is above the client count;
    // history retention off, so every answered row must still be there.
    let config = format!(
        "[lifecycle]\nmax_kernels = {}\n[history]\nmax_rows = 0\n",
        clients + 8
    );
    let setup = DaemonSetup::new(bin, &sandbox, &config)?;
    let r = run(&setup, clients, Duration::from_secs(seconds), &sandbox);
    setup.remove();
    let report = r?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report)? + "\n")?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    if report["errors"] != 0 || report["history_rows_lost"] != 0 {
        bail!("the load run had errors or lost history rows");
    }
    Ok(())
}

struct Tally {
    latencies: Vec<Duration>,
    errors: Vec<String>,
    acked: Vec<String>,
}

fn run(
    setup: &DaemonSetup,
    clients: usize,
    len: Duration,
    sandbox: &str,
) -> Result<serde_json::Value> {
    let daemon = setup.start()?;
    let tally = Arc::new(Mutex::new(Tally {
        latencies: Vec::new(),
        errors: Vec::new(),
        acked: Vec::new(),
    }));
    // Each client's kernel starts before the clock does.
    let warm: Vec<_> = (0..clients)
        .map(|i| {
            let addr = setup.addr;
            std::thread::spawn(move || {
                let mut c = Conn::new(addr, Duration::from_secs(60));
                c.post(
                    &format!("/v1/sessions/load{i}/execute"),
                    &json!({"code": "i = 0"}),
                )
            })
        })
        .collect();
    for w in warm {
        match w.join() {
            Ok(Ok((200, _))) => {}
            other => bail!("a client's first cell failed: {other:?}"),
        }
    }
    let start = Instant::now();
    let end = start + len;
    let rss_before = daemon.rss_kib();
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let (addr, tally) = (setup.addr, tally.clone());
            std::thread::spawn(move || client(addr, i, end, &tally))
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let elapsed = start.elapsed();
    let rss_after = daemon.rss_kib();
    let fds = daemon.fd_count();
    let code = daemon.stop()?;
    let (recorded, history_rows) = reliability::history_ids(&setup.data_dir())?;
    let t = tally.lock().unwrap();
    let lost = t.acked.iter().filter(|id| !recorded.contains(*id)).count();
    let s = stats::Summary::of(&t.latencies).context("no cell was answered")?;
    let mut errors: Vec<String> = t.errors.iter().take(10).cloned().collect();
    if code != Some(0) {
        errors.push(format!("the daemon exited {code:?} after SIGTERM"));
    }
    Ok(json!({
        "clients": clients,
        "seconds": (elapsed.as_secs_f64() * 10.0).round() / 10.0,
        "sandbox": sandbox,
        "cell": "i += 1; i (a warm session kernel per client)",
        "cells": t.latencies.len(),
        "cells_per_second": (t.latencies.len() as f64 / elapsed.as_secs_f64()).round(),
        "latency_ms": s.scaled(1e-3).to_json(),
        "errors": t.errors.len() + usize::from(code != Some(0)),
        "error_samples": errors,
        "history_rows": history_rows,
        "history_rows_lost": lost,
        "daemon_rss_mib": {"before": rss_before / 1024, "after": rss_after / 1024},
        "daemon_fds_at_end": fds,
    }))
}

fn client(addr: std::net::SocketAddr, i: usize, end: Instant, tally: &Mutex<Tally>) {
    let mut c = Conn::new(addr, Duration::from_secs(60));
    let path = format!("/v1/sessions/load{i}/execute");
    let (mut lat, mut errs, mut acked) = (Vec::new(), Vec::new(), Vec::new());
    let mut seq = 0u64;
    while Instant::now() < end {
        seq += 1;
        let id = format!("load {i} {seq}");
        let t = Instant::now();
        let r = c.post(&path, &json!({"code": format!("# {id}\ni += 1\ni")}));
        let d = t.elapsed();
        match r {
            Ok((200, v))
                if v["status"] == "success"
                    && v["value"].as_str() == Some(seq.to_string().as_str()) =>
            {
                lat.push(d);
                acked.push(id);
            }
            Ok((code, v)) => errs.push(format!("{id}: HTTP {code}: {v}")),
            Err(e) => errs.push(format!("{id}: {e}")),
        }
    }
    let mut t = tally.lock().unwrap();
    t.latencies.extend(lat);
    t.errors.extend(errs);
    t.acked.extend(acked);
}
