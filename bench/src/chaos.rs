//! Chaos run: 32 sessions send random cells to a real `cellhost serve`
//! while a driver SIGKILLs kernels, interrupts cells, a small kernel cap
//! forces evictions, and the daemon itself is SIGKILLed and restarted.
//! Checks: every answer tells the truth (status; state_lost/state_reset
//! against a per-session counter), no process of a killed or stopped
//! daemon survives it (scanned in /proc), the daemon's fd count is the
//! same at quiet checkpoints, no staging dir is left after the final
//! shutdown, and every answered cell is in the history. Bounded: stops
//! after `--seconds`; exits 1 when any check failed.
//!
//! Usage: cellhost-bench-chaos [--seconds 180] [--sessions 32]
//!        [--max-kernels 8] [--sandbox strict|none] [--seed N]
//!        [--cellhost PATH] [--out bench/results/chaos.json]

#[allow(dead_code)]
#[path = "procfs.rs"]
mod procfs;
#[path = "reliability/mod.rs"]
mod reliability;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reliability::client::Conn;
use reliability::daemon::{Daemon, DaemonSetup};
use reliability::worker::{driver, worker, Rng, Shared};
use serde_json::{json, Value};

struct Opts {
    seconds: u64,
    sessions: usize,
    max_kernels: usize,
    sandbox: String,
    seed: u64,
    cellhost: Option<PathBuf>,
    out: PathBuf,
}

fn opts() -> Result<Opts> {
    let mut o = Opts {
        seconds: 180,
        sessions: 32,
        max_kernels: 8,
        sandbox: "strict".into(),
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64,
        cellhost: None,
        out: "bench/results/chaos.json".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--seconds" => o.seconds = val()?.parse()?,
            "--sessions" => o.sessions = val()?.parse()?,
            "--max-kernels" => o.max_kernels = val()?.parse()?,
            "--sandbox" => o.sandbox = val()?,
            "--seed" => o.seed = val()?.parse()?,
            "--cellhost" => o.cellhost = Some(val()?.into()),
            "--out" => o.out = val()?.into(),
            other => {
                bail!("unknown argument {other}; see the usage at the top of bench/src/chaos.rs")
            }
        }
    }
    Ok(o)
}

/// Figures of one daemon process's life.
#[derive(Default)]
struct Life {
    fds: Vec<(usize, usize)>,
    evictions: u64,
    spawns: u64,
    orphans: Vec<u32>,
    max_rss_kib: u64,
}

fn main() -> Result<()> {
    let o = opts()?;
    let bin = reliability::cellhost_bin(o.cellhost.clone())?;
    // CHAOS_TEMPLATE=0: `none` kernels spawned plainly, not forked from
    // a warm template (to tell the two apart).
    let template = std::env::var("CHAOS_TEMPLATE").as_deref() != Ok("0");
    let config = format!(
        "[lifecycle]\nmax_kernels = {}\nwarm_pool = 2\n[kernel]\ntemplate = {template}\n",
        o.max_kernels
    );
    let setup = DaemonSetup::new(bin, &o.sandbox, &config)?;
    let result = run(&o, &setup);
    setup.remove();
    let (report, ok) = result?;
    if let Some(dir) = o.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&o.out, serde_json::to_string_pretty(&report)? + "\n")?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    if !ok {
        bail!(
            "the chaos run found problems (see \"failures\" above; replay with --seed {})",
            o.seed
        );
    }
    Ok(())
}

fn run(o: &Opts, setup: &DaemonSetup) -> Result<(Value, bool)> {
    let shared = Arc::new(Shared::default());
    let sessions: Vec<String> = (0..o.sessions).map(|i| format!("s{i:02}")).collect();
    let mut rng = Rng::new(o.seed);
    let started = Instant::now();
    let end = started + Duration::from_secs(o.seconds);
    let life_len = Duration::from_secs((o.seconds / 5).max(12));
    let mut daemon = setup.start()?;
    let mut threads = Vec::new();
    for s in &sessions {
        let (sh, s, seed) = (shared.clone(), s.clone(), rng.next());
        let addr = setup.addr;
        threads.push(std::thread::spawn(move || worker(sh, addr, s, seed)));
    }
    let (sh, seed, addr) = (shared.clone(), rng.next(), setup.addr);
    let snapshots = setup.data_dir().join("snapshots");
    let n = sessions.len();
    threads.push(std::thread::spawn(move || {
        driver(sh, addr, seed, snapshots, n)
    }));
    let mut lives: Vec<Life> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    loop {
        let mut life = Life::default();
        for _ in 0..2 {
            sleep_for(life_len.mul_f64(0.35), &mut life, &daemon);
            let sample = checkpoint(&shared, setup.addr, &daemon, &sessions, &mut life)?;
            life.fds.push(sample);
        }
        let last = Instant::now() + life_len * 2 > end;
        let tail = life_len.mul_f64(0.05 + rng.below(25) as f64 / 100.0);
        sleep_for(tail, &mut life, &daemon);
        scrape(setup.addr, &mut life);
        if last {
            quiesce(&shared)?;
            shared.stop.store(true, Ordering::SeqCst);
            let code = daemon.stop()?;
            if code != Some(0) {
                failures.push(format!("the daemon exited {code:?} after SIGTERM"));
            }
            life.orphans = setup.orphans_after(None, Duration::from_secs(3));
            lives.push(life);
            break;
        }
        daemon.sigkill();
        shared.count("fault: daemon SIGKILL", 1);
        life.orphans = setup.orphans_after(None, Duration::from_secs(3));
        lives.push(life);
        daemon = setup.start()?;
    }
    for t in threads {
        let _ = t.join();
    }
    // Every answered cell must be in the history.
    let (recorded, history_rows) = reliability::history_ids(&setup.data_dir())?;
    let acked = shared.acked.lock().unwrap().clone();
    let lost: Vec<&String> = acked.iter().filter(|id| !recorded.contains(*id)).collect();
    let staging = setup.staging_left();
    let lies = shared.lies.lock().unwrap().clone();
    let orphans: usize = lives.iter().map(|l| l.orphans.len()).sum();
    let mut fd_drift = Vec::new();
    for (i, l) in lives.iter().enumerate() {
        if let [(fa, ka), (fb, kb)] = l.fds[..] {
            if ka == kb && fa.abs_diff(fb) > 4 {
                fd_drift.push(format!(
                    "life {i}: {fa} fds with {ka} kernels (pool included), then {fb} with {kb}"
                ));
            }
        }
    }
    failures.extend(lies.iter().take(50).cloned());
    if !lost.is_empty() {
        failures.push(format!(
            "{} answered cells missing from the history: {:?}",
            lost.len(),
            &lost[..lost.len().min(10)]
        ));
    }
    if orphans > 0 {
        failures.push(format!("{orphans} processes outlived their daemon"));
    }
    if !staging.is_empty() {
        failures.push(format!("staging dirs left after shutdown: {staging:?}"));
    }
    failures.extend(fd_drift.iter().cloned());
    let counts = shared.counts.lock().unwrap().clone();
    let report = json!({
        "seed": o.seed,
        "seconds": started.elapsed().as_secs_f64().round(),
        "sessions": o.sessions,
        "max_kernels": o.max_kernels,
        "sandbox": o.sandbox,
        "daemon_lives": lives.len(),
        "cells_sent": shared.sent.load(Ordering::Relaxed),
        "cells_answered": acked.len(),
        "counts": counts,
        "evictions": lives.iter().map(|l| l.evictions).sum::<u64>(),
        "kernel_spawns": lives.iter().map(|l| l.spawns).sum::<u64>(),
        "untruthful_answers": lies.len(),
        "orphans_found": orphans,
        "history_rows": history_rows,
        "history_rows_lost": lost.len(),
        "staging_dirs_left": staging.len(),
        "fd_checkpoints": lives.iter().map(|l| json!(l.fds.iter().map(|(f, k)| json!({"fds": f, "kernels": k})).collect::<Vec<_>>())).collect::<Vec<_>>(),
        "fd_drift": fd_drift,
        "daemon_max_rss_mib": lives.iter().map(|l| l.max_rss_kib).max().unwrap_or(0) / 1024,
        "failures": failures,
    });
    Ok((report, failures.is_empty()))
}

/// Sleep for `len`, sampling the daemon's RSS.
fn sleep_for(len: Duration, life: &mut Life, daemon: &Daemon) {
    let end = Instant::now() + len;
    while Instant::now() < end {
        life.max_rss_kib = life.max_rss_kib.max(daemon.rss_kib());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Wait until no worker is inside a request (they pause first).
fn quiesce(shared: &Shared) -> Result<()> {
    shared.paused.store(true, Ordering::SeqCst);
    let end = Instant::now() + Duration::from_secs(60);
    while shared.busy.load(Ordering::SeqCst) > 0 {
        if Instant::now() > end {
            bail!("workers still busy 60 s after pausing");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn scrape(addr: SocketAddr, life: &mut Life) {
    let mut c = Conn::new(addr, Duration::from_secs(10));
    if let Ok((200, raw)) = c.request_raw("GET", "/metrics", None) {
        let text = String::from_utf8_lossy(&raw);
        life.evictions = life.evictions.max(reliability::metric(
            &text,
            "cellhost_kernel_evictions_total",
        ));
        life.spawns = life
            .spawns
            .max(reliability::metric(&text, "cellhost_kernel_spawns_total"));
    }
}

/// A quiet point: pause the workers, dispose every session, wait for the
/// pool to settle, and read the daemon's fd count and live kernels.
fn checkpoint(
    shared: &Shared,
    addr: SocketAddr,
    daemon: &Daemon,
    sessions: &[String],
    life: &mut Life,
) -> Result<(usize, usize)> {
    quiesce(shared)?;
    scrape(addr, life);
    let mut c = Conn::new(addr, Duration::from_secs(30));
    for s in sessions {
        if let Ok((200, _)) = c.delete(&format!("/v1/sessions/{s}")) {
            shared.count("fault: session disposed", 1);
        }
    }
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(15);
    let sample = loop {
        // Owned kernels plus the warm pool's (each holds a few fds).
        let pooled = match c.request_raw("GET", "/metrics", None) {
            Ok((200, raw)) => {
                reliability::metric(&String::from_utf8_lossy(&raw), "cellhost_kernels_pooled")
                    as usize
            }
            _ => usize::MAX / 2,
        };
        let kernels = match c.get("/v1/kernels") {
            Ok((200, v)) => v.as_array().map_or(0, Vec::len) + pooled,
            _ => usize::MAX,
        };
        seen.push((daemon.fd_count(), kernels));
        let n = seen.len();
        if n >= 4 && seen[n - 4..].iter().all(|s| *s == seen[n - 1]) || Instant::now() > end {
            break seen[n - 1];
        }
        std::thread::sleep(Duration::from_millis(150));
    };
    shared.paused.store(false, Ordering::SeqCst);
    Ok(sample)
}
