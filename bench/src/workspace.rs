//! Workspace benchmark, in one run:
//!
//! 1. a new strict session's first cell with its workspace on a volume of
//!    its own (`[limits] workspace_fs`, the default) against without (the
//!    upload-only quota): the spawn-path cost of making and mounting the
//!    volume, the two managers taking turns;
//! 2. a 1 GiB file uploaded and downloaded through the HTTP routes
//!    (`PUT`/`GET /v1/sessions/{s}/files/{path}`, an in-process server on
//!    a real manager, into a volume) against `cp` of the same file on the
//!    same disk, with this process's peak RSS (the daemon's: the client
//!    streams 256 KiB at a time).
//!
//! Usage: cellhost-bench-workspace [--python PATH] [--out FILE]
//! Environment: BENCH_FIRST (15) new sessions per variant, BENCH_MIB (1024).

#[path = "args.rs"]
mod args;
#[allow(dead_code)]
#[path = "stats.rs"]
mod stats;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use args::{env_usize, Args};
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::{Cell, KernelOptions, Sandbox};
use cellhost_server::{AppState, Listening, ServerOptions};
use serde_json::json;
use stats::Summary;

const CHUNK: usize = 256 * 1024;

fn options(dir: &Path, python: &Path, volumes: bool) -> ManagerOptions {
    ManagerOptions::new(dir.join("data"))
        .kernel(
            KernelOptions::default()
                .python(python)
                .runtime_dir(dir.join("run"))
                .sandbox(Sandbox::strict()),
        )
        .warm_pool(0)
        .idle_timeout(None)
        .workspace_fs(volumes)
}

async fn first_cell(m: &KernelManager, owner: &str) -> Result<Duration> {
    let t = Instant::now();
    let r = m.execute(owner, Cell::new("x=1")).await?;
    let took = t.elapsed();
    if !r.is_success() {
        bail!("first cell failed: {r:?}");
    }
    Ok(took)
}

fn vm(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Read an HTTP/1.1 response head; returns (status, content-length).
fn head(r: &mut BufReader<TcpStream>) -> Result<(u16, u64)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .context("no status")?
        .parse()?;
    let mut len = 0;
    loop {
        line.clear();
        r.read_line(&mut line)?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse()?;
        }
    }
    Ok((status, len))
}

fn upload(addr: SocketAddr, file: &Path) -> Result<Duration> {
    let size = std::fs::metadata(file)?.len();
    let t = Instant::now();
    let mut s = TcpStream::connect(addr)?;
    write!(
        s,
        "PUT /v1/sessions/bench/files/big.bin HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: {size}\r\n\r\n"
    )?;
    let mut f = std::fs::File::open(file)?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        s.write_all(&buf[..n])?;
    }
    let mut r = BufReader::new(s);
    let (status, len) = head(&mut r)?;
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    if status / 100 != 2 {
        bail!("upload: {status} {}", String::from_utf8_lossy(&body));
    }
    Ok(t.elapsed())
}

fn download(addr: SocketAddr, to: &Path) -> Result<Duration> {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr)?;
    write!(
        s,
        "GET /v1/sessions/bench/files/big.bin HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )?;
    let mut r = BufReader::with_capacity(CHUNK, s);
    let (status, len) = head(&mut r)?;
    if status != 200 {
        bail!("download: {status}");
    }
    let mut out = std::fs::File::create(to)?;
    let copied = std::io::copy(&mut r.take(len), &mut out)?;
    out.sync_all()?;
    if copied != len {
        bail!("download: {copied} of {len} bytes");
    }
    Ok(t.elapsed())
}

fn cp(from: &Path, to: &Path) -> Result<Duration> {
    let t = Instant::now();
    let st = std::process::Command::new("cp")
        .arg(from)
        .arg(to)
        .status()?;
    if !st.success() {
        bail!("cp failed");
    }
    std::fs::File::open(to)?.sync_all()?;
    Ok(t.elapsed())
}

async fn bench(args: Args) -> Result<serde_json::Value> {
    let first_n = env_usize("BENCH_FIRST", 15)?;
    let mib = env_usize("BENCH_MIB", 1024)? as u64;
    let dir = tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| "/tmp".into()))?;

    // 1. First cell of a new session, volumes on and off, taking turns.
    let on = KernelManager::start(options(&dir.path().join("on"), &args.python, true)).await;
    if let Some(w) = on.workspace_fs_warning() {
        bail!("this host cannot have workspace volumes: {w}");
    }
    let off = KernelManager::start(options(&dir.path().join("off"), &args.python, false)).await;
    first_cell(&on, "warm").await?; // the template, the interpreter's caches
    first_cell(&off, "warm").await?;
    let (mut t_on, mut t_off) = (Vec::new(), Vec::new());
    for i in 0..first_n {
        let (a, b) = if i % 2 == 0 { (&on, &off) } else { (&off, &on) };
        let ta = first_cell(a, &format!("s{i}")).await?;
        let tb = first_cell(b, &format!("s{i}")).await?;
        let (x, y) = if i % 2 == 0 { (ta, tb) } else { (tb, ta) };
        t_on.push(x);
        t_off.push(y);
        on.dispose_owner(&format!("s{i}")).await;
        off.dispose_owner(&format!("s{i}")).await;
    }
    off.shutdown().await;
    let s_on = Summary::of(&t_on).context("no samples")?;
    let s_off = Summary::of(&t_off).context("no samples")?;
    println!(
        "first cell of a new strict session: volume {:.1} ms, no volume {:.1} ms (p50): {:.3}x, {:+.1} ms",
        s_on.p50 / 1e3,
        s_off.p50 / 1e3,
        s_on.p50 / s_off.p50,
        (s_on.p50 - s_off.p50) / 1e3
    );

    // 2. 1 GiB through the HTTP routes against cp on the same disk.
    let big = dir.path().join("big.bin");
    {
        let mut f = std::fs::File::create(&big)?;
        let mut buf = vec![0u8; CHUNK];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..(mib << 20) / CHUNK as u64 {
            for b in buf.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
            }
            f.write_all(&buf)?;
        }
        f.sync_all()?;
    }
    let state = AppState::new(on.clone(), None, ServerOptions::default());
    let listening = Listening::bind("127.0.0.1:0".parse()?, false).await?;
    let addr = listening.addr;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(cellhost_server::serve(listening, state, async {
        let _ = stopped.await;
    }));
    let rss_before = vm("VmRSS:");
    let copy = dir.path().join("copy.bin");
    let back = dir.path().join("back.bin");
    let mut rows = Vec::new();
    for round in 0..2 {
        let t_cp = tokio::task::spawn_blocking({
            let (big, copy) = (big.clone(), copy.clone());
            move || cp(&big, &copy)
        })
        .await??;
        std::fs::remove_file(&copy)?;
        let t_up = tokio::task::spawn_blocking({
            let big = big.clone();
            move || upload(addr, &big)
        })
        .await??;
        let t_down = tokio::task::spawn_blocking({
            let back = back.clone();
            move || download(addr, &back)
        })
        .await??;
        std::fs::remove_file(&back)?;
        let mbs = |d: Duration| mib as f64 / d.as_secs_f64();
        println!(
            "round {round}: cp {:.0} MiB/s, upload {:.0} MiB/s ({:.2}x cp), download {:.0} MiB/s ({:.2}x cp)",
            mbs(t_cp),
            mbs(t_up),
            t_cp.as_secs_f64() / t_up.as_secs_f64(),
            mbs(t_down),
            t_cp.as_secs_f64() / t_down.as_secs_f64()
        );
        rows.push(json!({
            "cp_mib_s": mbs(t_cp), "upload_mib_s": mbs(t_up), "download_mib_s": mbs(t_down),
            "upload_over_cp": t_cp.as_secs_f64() / t_up.as_secs_f64(),
            "download_over_cp": t_cp.as_secs_f64() / t_down.as_secs_f64(),
        }));
    }
    let peak = vm("VmHWM:");
    println!(
        "daemon RSS: {} KiB before, peak {} KiB (+{} KiB)",
        rss_before,
        peak,
        peak.saturating_sub(rss_before)
    );
    let _ = stop.send(());
    let _ = server.await;
    on.shutdown().await;
    Ok(json!({
        "python": args.python,
        "first_cell_ms": {
            "volume": s_on.scaled(1e-3).to_json(),
            "no_volume": s_off.scaled(1e-3).to_json(),
            "volume_over_no_volume_p50": s_on.p50 / s_off.p50,
        },
        "file_mib": mib,
        "transfer": rows,
        "rss_kib": {"before": rss_before, "peak": peak},
    }))
}

fn main() {
    let args = match args::parse("bench/results/workspace.json") {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cellhost-bench-workspace: {e:#}");
            std::process::exit(2);
        }
    };
    let out = args.out.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(bench(args)) {
        Ok(v) => {
            if let Some(d) = out.parent() {
                let _ = std::fs::create_dir_all(d);
            }
            let _ = std::fs::write(&out, serde_json::to_string_pretty(&v).unwrap() + "\n");
            println!("figures written to {}", out.display());
        }
        Err(e) => {
            eprintln!("cellhost-bench-workspace: could not run: {e:#}");
            std::process::exit(1);
        }
    }
}
