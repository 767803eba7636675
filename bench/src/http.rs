//! HTTP benchmark: the daemon's execute round trip for a trivial cell over
//! one keep-alive connection, beside the same cell through the library
//! (`KernelManager::execute`) in the same run; then throughput with 32
//! concurrent sessions, over HTTP and through the library.
//!
//! Both paths use one manager on the daemon's runtime (multi-thread), so
//! the difference is the HTTP layer: hyper, routing, JSON in and out, the
//! per-cell task, metrics and the history record (SQLite on, as the
//! daemon runs by default).
//!
//! Usage: cellhost-bench-http [--python PATH] [--out FILE]
//! Environment: BENCH_N (2000) cells per path, BENCH_WARMUP (200),
//! BENCH_SESSIONS (32), BENCH_PER_SESSION (200) cells each under load.

#[path = "args.rs"]
mod args;
#[allow(dead_code)]
#[path = "stats.rs"]
mod stats;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use args::{env_usize, Args};
use cellhost::config::HistoryConfig;
use cellhost::history::History;
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::{Cell, KernelOptions, Status};
use cellhost_server::{AppState, Listening, ServerOptions};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use stats::Summary;

/// Cells per interleaved block: the two paths take turns in blocks this
/// size, so drift on a noisy machine hits both alike.
const BLOCK: usize = 100;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(c)
}

async fn http_cell(c: &HttpClient, addr: SocketAddr, session: &str) -> Result<()> {
    let req = hyper::Request::post(format!("http://{addr}/v1/sessions/{session}/execute"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"code":"x=1"}"#)))?;
    let resp = c.request(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    if !status.is_success() || !body.starts_with(br#"{"status":"success""#) {
        bail!("HTTP {status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(())
}

/// A lean async client: one keep-alive connection, the request's bytes
/// written as they are, the answer read up to its `content-length` (what a
/// client in another process costs, without hyper's connection task).
struct Lean {
    s: tokio::net::TcpStream,
    req: Vec<u8>,
    buf: Vec<u8>,
}

impl Lean {
    async fn connect(addr: SocketAddr, session: &str) -> Result<Lean> {
        let s = tokio::net::TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        let body = br#"{"code":"x=1"}"#;
        let mut req = format!(
            "POST /v1/sessions/{session}/execute HTTP/1.1\r\nHost: localhost\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        Ok(Lean {
            s,
            req,
            buf: Vec::with_capacity(4096),
        })
    }

    async fn cell(&mut self) -> Result<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.s.write_all(&self.req).await?;
        self.buf.clear();
        loop {
            if self.s.read_buf(&mut self.buf).await? == 0 {
                bail!("the server closed the connection");
            }
            if answered(&self.buf, Some(SUCCESS))? {
                return Ok(());
            }
        }
    }
}

/// Whether `buf` holds a whole answer (up to its `content-length`); an
/// error when it is not a 200 whose body starts with `expect` (when given).
fn answered(buf: &[u8], expect: Option<&[u8]>) -> Result<bool> {
    let Some(h) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(false);
    };
    let head = std::str::from_utf8(&buf[..h])?.to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .context("no content-length")?
        .trim()
        .parse()?;
    if buf.len() < h + 4 + len {
        return Ok(false);
    }
    if let Some(e) = expect {
        if !head.starts_with("http/1.1 200") || !buf[h + 4..h + 4 + len].starts_with(e) {
            bail!("unexpected answer: {}", String::from_utf8_lossy(buf));
        }
    }
    Ok(true)
}

/// One request on a blocking keep-alive socket, like a lean client in
/// another process would send it; checks the status line and, when
/// `expect` is given, the start of the body.
fn raw_round_trip(
    s: &mut std::net::TcpStream,
    buf: &mut Vec<u8>,
    req: &[u8],
    expect: Option<&[u8]>,
) -> Result<()> {
    use std::io::{Read, Write};
    s.write_all(req)?;
    buf.clear();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            bail!("the server closed the connection");
        }
        buf.extend_from_slice(&chunk[..n]);
        if answered(buf, expect)? {
            return Ok(());
        }
    }
}

fn raw_block(
    mut s: std::net::TcpStream,
    req: &'static [u8],
    expect: Option<&'static [u8]>,
    count: usize,
) -> Result<(std::net::TcpStream, Vec<Duration>)> {
    let mut buf = Vec::with_capacity(4096);
    let mut v = Vec::with_capacity(count);
    for _ in 0..count {
        let t = Instant::now();
        raw_round_trip(&mut s, &mut buf, req, expect)?;
        v.push(t.elapsed());
    }
    Ok((s, v))
}

const EXEC_REQ: &[u8] = b"POST /v1/sessions/http/execute HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n{\"code\":\"x=1\"}";
const FLOOR_REQ: &[u8] = b"GET /v1/none HTTP/1.1\r\nHost: localhost\r\n\r\n";
const SUCCESS: &[u8] = br#"{"status":"success""#;

async fn lib_cell(m: &KernelManager, session: &str) -> Result<()> {
    let r = m.execute(session, Cell::new("x=1")).await?;
    if r.status != Status::Success {
        bail!("library cell ended {}", r.status.as_str());
    }
    Ok(())
}

/// `sessions` concurrent callers, `per` cells each; (cells/s, latencies).
async fn load(
    sessions: usize,
    per: usize,
    run: impl Fn(usize) -> tokio::task::JoinHandle<Result<Vec<Duration>>>,
) -> Result<(f64, Summary)> {
    let t0 = Instant::now();
    let handles: Vec<_> = (0..sessions).map(&run).collect();
    let mut all = Vec::with_capacity(sessions * per);
    for h in handles {
        all.extend(h.await??);
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((
        (sessions * per) as f64 / secs,
        Summary::of(&all).context("no samples")?,
    ))
}

async fn bench(args: Args) -> Result<serde_json::Value> {
    let n = env_usize("BENCH_N", 2000)?;
    let warmup = env_usize("BENCH_WARMUP", 200)?;
    let sessions = env_usize("BENCH_SESSIONS", 32)?;
    let per = env_usize("BENCH_PER_SESSION", 200)?;
    let dir = tempfile::tempdir()?;
    let manager = KernelManager::start(
        ManagerOptions::new(dir.path().join("data"))
            .kernel(
                KernelOptions::default()
                    .python(&args.python)
                    .runtime_dir(dir.path().join("run")),
            )
            .max_kernels(2 * sessions + 4)
            .warm_pool(0)
            .idle_timeout(None),
    )
    .await;
    // BENCH_WAIT_FOR_COMMIT=0: `[history] wait_for_commit = false`.
    let history = History::open(
        &dir.path().join("data/history.sqlite"),
        &HistoryConfig {
            wait_for_commit: std::env::var("BENCH_WAIT_FOR_COMMIT").as_deref() != Ok("0"),
            ..HistoryConfig::default()
        },
        [],
    )?;
    // BENCH_HISTORY=0 measures the HTTP layer without the history record.
    let history = (std::env::var("BENCH_HISTORY").as_deref() != Ok("0")).then(|| Arc::new(history));
    let with_history = history.is_some();
    let history_handle = history.clone();
    let state = AppState::new(manager.clone(), history, ServerOptions::default());
    let listening = Listening::bind("127.0.0.1:0".parse()?, false).await?;
    let addr = listening.addr;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(cellhost_server::serve(listening, state, async {
        let _ = stopped.await;
    }));
    let c = client();

    // Warm both kernels, then interleave blocks. HTTP goes over one
    // keep-alive socket from a blocking thread (a lean client).
    let mut sock = std::net::TcpStream::connect(addr)?;
    sock.set_nodelay(true)?;
    let (s2, _) =
        tokio::task::spawn_blocking(move || raw_block(sock, EXEC_REQ, Some(SUCCESS), warmup))
            .await??;
    sock = s2;
    for _ in 0..warmup {
        lib_cell(&manager, "lib").await?;
    }
    let (mut http, mut lib) = (Vec::with_capacity(n), Vec::with_capacity(n));
    while http.len() < n {
        let count = BLOCK.min(n - http.len());
        let (s2, v) =
            tokio::task::spawn_blocking(move || raw_block(sock, EXEC_REQ, Some(SUCCESS), count))
                .await??;
        sock = s2;
        http.extend(v);
        for _ in 0..BLOCK.min(n - lib.len()) {
            let t = Instant::now();
            lib_cell(&manager, "lib").await?;
            lib.push(t.elapsed());
        }
    }
    // The HTTP floor on this server: a 404 from the router, no cell.
    let (_, floor) =
        tokio::task::spawn_blocking(move || raw_block(sock, FLOOR_REQ, None, n)).await??;
    let floor = Summary::of(&floor).context("no samples")?;
    let http = Summary::of(&http).context("no samples")?;
    let lib = Summary::of(&lib).context("no samples")?;

    // Throughput: one kernel per session, warmed first.
    for i in 0..sessions {
        http_cell(&c, addr, &format!("h{i}")).await?;
        lib_cell(&manager, &format!("l{i}")).await?;
    }
    let (http_tput, http_load) = load(sessions, per, |i| {
        let c = client();
        tokio::spawn(async move {
            let mut v = Vec::with_capacity(per);
            for _ in 0..per {
                let t = Instant::now();
                http_cell(&c, addr, &format!("h{i}")).await?;
                v.push(t.elapsed());
            }
            Ok(v)
        })
    })
    .await?;
    let commits_before = history_handle.as_ref().map_or(0, |h| h.commits());
    let (lean_tput, lean_load) = load(sessions, per, |i| {
        tokio::spawn(async move {
            let mut c = Lean::connect(addr, &format!("h{i}")).await?;
            let mut v = Vec::with_capacity(per);
            for _ in 0..per {
                let t = Instant::now();
                c.cell().await?;
                v.push(t.elapsed());
            }
            Ok(v)
        })
    })
    .await?;
    // Rows per history transaction under the lean load (group commit).
    let lean_commits = history_handle.as_ref().map_or(0, |h| h.commits()) - commits_before;
    let (lib_tput, lib_load) = load(sessions, per, |i| {
        let m = manager.clone();
        tokio::spawn(async move {
            let mut v = Vec::with_capacity(per);
            for _ in 0..per {
                let t = Instant::now();
                lib_cell(&m, &format!("l{i}")).await?;
                v.push(t.elapsed());
            }
            Ok(v)
        })
    })
    .await?;
    let _ = stop.send(());
    let _ = server.await;

    let overhead = http.p50 - lib.p50;
    println!(
        "cellhost HTTP benchmark (x=1, one keep-alive connection from a blocking client, history {}; load avg {})",
        if with_history { "on" } else { "off" },
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "{:<34} {:>10} {:>10} {:>10}",
        "", "p50 µs", "p99 µs", "mean µs"
    );
    println!(
        "{:<34} {:>10.1} {:>10.1} {:>10.1}",
        "library (KernelManager::execute)", lib.p50, lib.p99, lib.mean
    );
    println!(
        "{:<34} {:>10.1} {:>10.1} {:>10.1}",
        "HTTP POST /v1/.../execute", http.p50, http.p99, http.mean
    );
    println!(
        "{:<34} {:>10.1} {:>10.1} {:>10.1}",
        "HTTP floor (GET -> 404, no cell)", floor.p50, floor.p99, floor.mean
    );
    println!(
        "HTTP p50 - library p50: {overhead:.1} µs (target <= 100 µs: {})",
        if overhead <= 100.0 { "met" } else { "MISSED" }
    );
    println!("{sessions} concurrent sessions x {per} cells:");
    println!(
        "  HTTP, hyper clients {http_tput:>8.0} cells/s  p50 {:.1} µs  p99 {:.1} µs",
        http_load.p50, http_load.p99
    );
    println!(
        "  HTTP, lean clients {lean_tput:>8.0} cells/s  p50 {:.1} µs  p99 {:.1} µs ({:.2}x the library; target >= 0.6x)",
        lean_load.p50,
        lean_load.p99,
        lean_tput / lib_tput
    );
    println!(
        "  library  {lib_tput:>8.0} cells/s  p50 {:.1} µs  p99 {:.1} µs",
        lib_load.p50, lib_load.p99
    );
    Ok(json!({
        "n": n,
        "history": with_history,
        "library": lib.to_json(),
        "http": http.to_json(),
        "http_floor_404": floor.to_json(),
        "http_minus_library_p50_us": (overhead * 10.0).round() / 10.0,
        "target_met": overhead <= 100.0,
        "concurrent": {
            "sessions": sessions,
            "cells_per_session": per,
            "http_cells_per_second": http_tput.round(),
            "library_cells_per_second": lib_tput.round(),
            "http_lean_cells_per_second": lean_tput.round(),
            "http_lean": lean_load.to_json(),
            "lean_to_library": ((lean_tput / lib_tput) * 1000.0).round() / 1000.0,
            "lean_history_transactions": lean_commits,
            "lean_rows_per_transaction": ((sessions * per) as f64 / lean_commits.max(1) as f64 * 10.0).round() / 10.0,
            "http": http_load.to_json(),
            "library": lib_load.to_json(),
        },
    }))
}

fn main() {
    let args = match args::parse("bench/results/http.json") {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cellhost-bench-http: {e:#}");
            std::process::exit(2);
        }
    };
    let out = args.out.clone();
    // The daemon's own runtime (`cellhost serve`).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cellhost_server::worker_threads())
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    match rt.block_on(bench(args)) {
        Ok(v) => {
            if let Err(e) = std::fs::write(&out, serde_json::to_string_pretty(&v).unwrap() + "\n") {
                eprintln!("cellhost-bench-http: cannot write {}: {e}", out.display());
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("cellhost-bench-http: {e:#}");
            std::process::exit(1);
        }
    }
}
