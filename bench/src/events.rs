//! Events benchmark: the cost of watching a session live. A warm `x=1`
//! over HTTP (one keep-alive connection from a blocking client) in four
//! sessions of one in-process daemon, taking turns in blocks: one
//! session nobody watches (the reference), a second nobody watches (the
//! noise between two identical paths), one with 1 watcher and one with 8
//! watchers on `GET /v1/sessions/{session}/events`, each a blocking
//! reader in its own thread that reads every event.
//!
//! Targets: 1 watcher within noise of none; 8 watchers at most 1.2x.
//!
//! Usage: cellhost-bench-events [--python PATH] [--out FILE]
//! Environment: BENCH_N (2000) cells per session, BENCH_WARMUP (200).

#[path = "args.rs"]
mod args;
#[allow(dead_code)]
#[path = "stats.rs"]
mod stats;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use args::{env_usize, Args};
use cellhost::config::HistoryConfig;
use cellhost::history::History;
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::KernelOptions;
use cellhost_server::{AppState, Listening, ServerOptions};
use serde_json::json;
use stats::Summary;

/// Cells per block: the sessions take turns in blocks this size, so
/// drift on a noisy machine hits all alike.
const BLOCK: usize = 50;

/// The sessions: (name, watchers).
const SESSIONS: [(&str, usize); 4] = [("none", 0), ("none-again", 0), ("one", 1), ("eight", 8)];

fn round_trip(s: &mut TcpStream, buf: &mut Vec<u8>, req: &[u8]) -> Result<()> {
    s.write_all(req)?;
    buf.clear();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            bail!("the server closed the connection");
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(h) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = std::str::from_utf8(&buf[..h])?.to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .context("no content-length")?
            .trim()
            .parse()?;
        if buf.len() < h + 4 + len {
            continue;
        }
        if !head.starts_with("http/1.1 200") || !buf[h + 4..].starts_with(br#"{"status":"success""#)
        {
            bail!("unexpected answer: {}", String::from_utf8_lossy(buf));
        }
        return Ok(());
    }
}

fn exec_request(session: &str) -> Vec<u8> {
    format!(
        "POST /v1/sessions/{session}/execute HTTP/1.1\r\nHost: localhost\r\n\
         Content-Type: application/json\r\nContent-Length: 14\r\n\r\n{{\"code\":\"x=1\"}}"
    )
    .into_bytes()
}

/// A watcher: reads the session's stream in its own thread and counts
/// the `cell_finished` events it saw.
fn watch(addr: SocketAddr, session: &str, finished: Arc<AtomicUsize>) -> Result<()> {
    let mut s = TcpStream::connect(addr)?;
    write!(
        s,
        "GET /v1/sessions/{session}/events HTTP/1.0\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n"
    )?;
    std::thread::spawn(move || {
        let needle = b"event: cell_finished";
        let mut chunk = [0u8; 64 * 1024];
        let mut tail: Vec<u8> = Vec::new();
        while let Ok(n) = s.read(&mut chunk) {
            if n == 0 {
                return;
            }
            tail.extend_from_slice(&chunk[..n]);
            let hits = tail.windows(needle.len()).filter(|w| w == needle).count();
            finished.fetch_add(hits, Ordering::Relaxed);
            let keep = tail.len().saturating_sub(needle.len() - 1);
            tail.drain(..keep);
        }
    });
    Ok(())
}

fn block(
    mut s: TcpStream,
    req: Vec<u8>,
    count: usize,
) -> Result<(TcpStream, Vec<u8>, Vec<Duration>)> {
    let mut buf = Vec::with_capacity(4096);
    let mut v = Vec::with_capacity(count);
    for _ in 0..count {
        let t = Instant::now();
        round_trip(&mut s, &mut buf, &req)?;
        v.push(t.elapsed());
    }
    Ok((s, req, v))
}

async fn bench(args: Args) -> Result<serde_json::Value> {
    let n = env_usize("BENCH_N", 2000)?;
    let warmup = env_usize("BENCH_WARMUP", 200)?;
    let dir = tempfile::tempdir()?;
    let manager = KernelManager::start(
        ManagerOptions::new(dir.path().join("data"))
            .kernel(
                KernelOptions::default()
                    .python(&args.python)
                    .runtime_dir(dir.path().join("run")),
            )
            .max_kernels(8)
            .warm_pool(0)
            .idle_timeout(None),
    )
    .await;
    let history = History::open(
        &dir.path().join("data/history.sqlite"),
        &HistoryConfig::default(),
        [],
    )?;
    let state = AppState::new(
        manager.clone(),
        Some(Arc::new(history)),
        ServerOptions::default(),
    );
    let listening = Listening::bind("127.0.0.1:0".parse()?, false).await?;
    let addr = listening.addr;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(cellhost_server::serve(listening, state, async {
        let _ = stopped.await;
    }));

    let mut socks = Vec::new();
    let mut seen = Vec::new();
    for (name, watchers) in SESSIONS {
        let finished = Arc::new(AtomicUsize::new(0));
        for _ in 0..watchers {
            watch(addr, name, finished.clone())?;
        }
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        let (s, req, _) =
            tokio::task::spawn_blocking(move || block(s, exec_request(name), warmup)).await??;
        socks.push(Some((s, req)));
        seen.push(finished);
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(n); SESSIONS.len()];
    while samples[0].len() < n {
        let count = BLOCK.min(n - samples[0].len());
        for (i, slot) in socks.iter_mut().enumerate() {
            let (s, req) = slot.take().context("socket")?;
            let (s, req, v) = tokio::task::spawn_blocking(move || block(s, req, count)).await??;
            *slot = Some((s, req));
            samples[i].extend(v);
        }
    }
    // Let the watchers read the last events.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop.send(());
    let _ = server.await;

    let sums: Vec<Summary> = samples
        .iter()
        .map(|v| Summary::of(v).context("no samples"))
        .collect::<Result<_>>()?;
    let base = sums[0];
    let ratio = |s: &Summary| s.p50 / base.p50;
    let noise = (ratio(&sums[1]) - 1.0).abs();
    let (one, eight) = (ratio(&sums[2]), ratio(&sums[3]));
    // Within noise: no further from 1 than the two unwatched sessions
    // are from each other, or 5%, whichever is larger.
    let band = noise.max(0.05);
    let one_met = one - 1.0 <= band;
    let eight_met = eight <= 1.2;
    println!(
        "cellhost events benchmark (x=1 over HTTP, {n} cells per session, interleaved in blocks of {BLOCK}; load avg {})",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "{:<26} {:>10} {:>10} {:>10} {:>8} {:>10}",
        "", "p50 µs", "p99 µs", "mean µs", "p50 ×", "finished"
    );
    let total = warmup + n;
    for (i, (name, w)) in SESSIONS.iter().enumerate() {
        let s = &sums[i];
        let got = seen[i].load(Ordering::Relaxed);
        println!(
            "{:<26} {:>10.1} {:>10.1} {:>10.1} {:>8.3} {:>10}",
            format!("{name} ({w} watchers)"),
            s.p50,
            s.p99,
            s.mean,
            ratio(s),
            if *w == 0 {
                "-".to_owned()
            } else {
                format!("{}/{}", got, w * total)
            }
        );
    }
    println!(
        "1 watcher: {one:.3}x (noise band ±{band:.3}: {}); 8 watchers: {eight:.3}x (target <= 1.2: {})",
        if one_met { "met" } else { "MISSED" },
        if eight_met { "met" } else { "MISSED" }
    );
    let rows: Vec<serde_json::Value> = SESSIONS
        .iter()
        .enumerate()
        .map(|(i, (name, w))| {
            json!({
                "session": name,
                "watchers": w,
                "latency": sums[i].to_json(),
                "p50_ratio": (ratio(&sums[i]) * 1000.0).round() / 1000.0,
                "cell_finished_seen": seen[i].load(Ordering::Relaxed),
                "cell_finished_expected": w * total,
            })
        })
        .collect();
    Ok(json!({
        "n": n,
        "block": BLOCK,
        "reference": "none (0 watchers), p50",
        "noise": (noise * 1000.0).round() / 1000.0,
        "sessions": rows,
        "one_watcher_within_noise": one_met,
        "eight_watchers_within_1_2x": eight_met,
    }))
}

fn main() {
    let args = match args::parse("bench/results/events.json") {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cellhost-bench-events: {e:#}");
            std::process::exit(2);
        }
    };
    let out = args.out.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    match rt.block_on(bench(args)) {
        Ok(v) => {
            if let Err(e) = std::fs::write(&out, serde_json::to_string_pretty(&v).unwrap() + "\n") {
                eprintln!("cellhost-bench-events: cannot write {}: {e}", out.display());
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("cellhost-bench-events: {e:#}");
            std::process::exit(1);
        }
    }
}
