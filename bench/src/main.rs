//! cellhost core benchmark: one warm kernel against the raw-pipe floor and
//! against Jupyter, in one invocation, printing figures and ratios.
//!
//! See bench/README.md for what each figure means. Exits non-zero only when
//! something could not run; a missed target is a figure, not a failure.

mod dialect;
mod jupyter;
mod library;
#[allow(dead_code)]
mod procfs;
mod raw;
mod report;
mod sandbox;
mod stats;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::raw::RawRunner;
use crate::report::Figures;
use crate::stats::Summary;

const USAGE: &str = "\
usage: cellhost-bench [--python PATH] [--jupyter-python PATH] [--out FILE]
       cellhost-bench sandbox [--python PATH] [--out FILE]
       cellhost-bench dialect [--python PATH] [--out FILE]

  --python PATH          interpreter for cellhost and the raw reference
                         (default: $BENCH_PYTHON, else /usr/bin/python3,
                         else python3 on PATH resolved past any shim)
  --jupyter-python PATH  the bench venv's python with jupyter_client and
                         ipykernel (default: bench/.venv/bin/python)
  --out FILE             where to write the JSON figures
                         (default: bench/results/core.json)

environment: BENCH_N (2000) cells per workload for cellhost and the raw
reference, BENCH_JUPYTER_N (300) for Jupyter, BENCH_WARMUP (200) cells,
BENCH_COLD (20) fresh kernels timed to first reply, BENCH_JUPYTER_COLD (3).

`sandbox`: plain, limits-only and strict-sandbox kernels side by side:
spawn p50 and warm x=1 p50 with ratios (default --out
bench/results/sandbox.json; BENCH_N defaults to 1000 there).

`dialect`: warm x=1 with the agent's dialect gate against kernels that
skip it (default --out bench/results/dialect.json; BENCH_N 30000).";

/// The workloads: code and what it must print.
const WORKLOADS: [(&str, &str); 2] = [("x=1", ""), ("print(1)", "1\n")];

/// Cells per interleaved block: cellhost and the raw reference take turns
/// in blocks this size, so drift on a noisy machine hits both alike.
const BLOCK: usize = 100;

struct Config {
    python: PathBuf,
    jupyter_python: PathBuf,
    out: PathBuf,
    n: usize,
    jupyter_n: usize,
    warmup: usize,
    cold: usize,
    jupyter_cold: usize,
}

fn main() {
    let mode = std::env::args_os().nth(1);
    let sandbox_mode = mode.as_ref().is_some_and(|a| a == "sandbox");
    let dialect_mode = mode.as_ref().is_some_and(|a| a == "dialect");
    let config = match parse_args() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("cellhost-bench: {e:#}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    let bench_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_or = |default: &str| {
        if config.out == bench_dir.join("results/core.json") {
            bench_dir.join(default)
        } else {
            config.out.clone()
        }
    };
    let result = if dialect_mode {
        let n = env_count("BENCH_N", 30000).unwrap_or(30000);
        runtime.block_on(dialect::run(
            &config.python,
            n,
            config.warmup,
            &out_or("results/dialect.json"),
        ))
    } else if sandbox_mode {
        let out = out_or("results/sandbox.json");
        let n = env_count("BENCH_N", 1000).unwrap_or(1000);
        runtime.block_on(sandbox::run(
            &config.python,
            n,
            config.warmup,
            config.cold,
            &out,
        ))
    } else {
        runtime.block_on(run(&config))
    };
    match result {
        Ok(()) => {}
        Err(e) => {
            eprintln!("cellhost-bench: could not run: {e:#}");
            std::process::exit(1);
        }
    }
}

async fn run(config: &Config) -> Result<()> {
    let python_version = python_version(&config.python)?;
    eprintln!(
        "cellhost-bench: python {} ({python_version}), N={} per workload, warm-up {}",
        config.python.display(),
        config.n,
        config.warmup
    );

    let [(x1_raw, x1_ch), (p1_raw, p1_ch)] = warm_loops(config).await?;

    eprintln!("cellhost-bench: {} cold starts each…", config.cold);
    let ch_cold = library::cold_starts(&config.python, config.cold).await?;
    let raw_cold = raw::cold_starts(&config.python, config.cold)?;

    eprintln!(
        "cellhost-bench: Jupyter ({} cells per workload)…",
        config.jupyter_n
    );
    let jupyter = jupyter::run(
        &config.jupyter_python,
        config.jupyter_n,
        config.warmup.min(config.jupyter_n),
        config.jupyter_cold,
    )?;

    let summary = |samples: &[Duration]| Summary::of(samples).context("no samples");
    let kib = |v: &[u64]| {
        let mut f: Vec<f64> = v.iter().map(|&k| k as f64).collect();
        Summary::of_micros(&mut f).context("no RSS readings")
    };
    let figures = Figures {
        python: config.python.clone(),
        python_version,
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        n: config.n,
        warmup: config.warmup,
        block: BLOCK,
        cold: config.cold,
        raw_x1_us: summary(&x1_raw)?,
        raw_print1_us: summary(&p1_raw)?,
        raw_first_reply_ms: summary(&raw_cold.first_reply)?.scaled(1e-3),
        raw_idle_rss_kib: kib(&raw_cold.idle_rss_kib)?,
        cellhost_x1_us: summary(&x1_ch)?,
        cellhost_print1_us: summary(&p1_ch)?,
        cellhost_spawn_ms: summary(&ch_cold.spawn)?.scaled(1e-3),
        cellhost_first_reply_ms: summary(&ch_cold.first_reply)?.scaled(1e-3),
        cellhost_idle_rss_kib: kib(&ch_cold.idle_rss_kib)?,
        jupyter_n: config.jupyter_n,
        jupyter,
    };
    print!("{}", report::table(&figures));
    let json = serde_json::to_string_pretty(&report::to_json(&figures))?;
    if let Some(dir) = config.out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&config.out, json + "\n")
        .with_context(|| format!("writing {}", config.out.display()))?;
    println!("figures written to {}", config.out.display());
    Ok(())
}

/// Warm loops for every workload: one cellhost kernel and one reference
/// runner, both warmed up, then taking turns in blocks of [`BLOCK`] cells.
/// Returns (raw samples, cellhost samples) per workload.
async fn warm_loops(config: &Config) -> Result<[(Vec<Duration>, Vec<Duration>); 2]> {
    let kernel = library::spawn(&config.python).await?;
    let mut runner = RawRunner::spawn(&config.python)?;
    let mut out: [(Vec<Duration>, Vec<Duration>); 2] = Default::default();
    for ((code, expect), (raw_samples, ch_samples)) in WORKLOADS.iter().zip(out.iter_mut()) {
        let mut discard = Vec::new();
        runner.time_cells(code, expect, config.warmup, &mut discard)?;
        library::time_cells(&kernel, code, expect, config.warmup, &mut discard).await?;

        let mut left = config.n;
        let mut block_no = 0;
        while left > 0 {
            let count = left.min(BLOCK);
            // Alternate who goes first, so neither always follows the other.
            if block_no % 2 == 0 {
                runner.time_cells(code, expect, count, raw_samples)?;
                library::time_cells(&kernel, code, expect, count, ch_samples).await?;
            } else {
                library::time_cells(&kernel, code, expect, count, ch_samples).await?;
                runner.time_cells(code, expect, count, raw_samples)?;
            }
            left -= count;
            block_no += 1;
        }
    }
    kernel.shutdown().await;
    runner.shutdown()?;
    Ok(out)
}

fn python_version(python: &Path) -> Result<String> {
    let out = Command::new(python)
        .args(["-I", "-c", "import sys; print(sys.version.split()[0])"])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !out.status.success() {
        bail!("{} -c ... exited with {}", python.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn parse_args() -> Result<Config> {
    let mut python = None;
    let mut jupyter_python = None;
    let mut out = None;
    let mut args = std::env::args_os()
        .skip(1)
        .skip_while(|a| a == "sandbox" || a == "dialect");
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .map(PathBuf::from)
                .with_context(|| format!("{name} needs a value"))
        };
        match arg.to_str() {
            Some("--python") => python = Some(value("--python")?),
            Some("--jupyter-python") => jupyter_python = Some(value("--jupyter-python")?),
            Some("--out") => out = Some(value("--out")?),
            Some("-h" | "--help") => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => bail!("unexpected argument {arg:?}"),
        }
    }
    let bench_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    Ok(Config {
        python: match python {
            Some(p) => p,
            None => default_python()?,
        },
        jupyter_python: jupyter_python.unwrap_or_else(|| bench_dir.join(".venv/bin/python")),
        out: out.unwrap_or_else(|| bench_dir.join("results/core.json")),
        n: env_count("BENCH_N", 2000)?,
        jupyter_n: env_count("BENCH_JUPYTER_N", 300)?,
        warmup: env_count("BENCH_WARMUP", 200)?,
        cold: env_count("BENCH_COLD", 20)?,
        jupyter_cold: env_count("BENCH_JUPYTER_COLD", 3)?,
    })
}

/// `$BENCH_PYTHON`, else Debian's `/usr/bin/python3`, else `python3` on
/// PATH resolved once past any shim (pyenv's costs ~100 ms a start).
fn default_python() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("BENCH_PYTHON").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let debian = Path::new("/usr/bin/python3");
    if debian.exists() {
        return Ok(debian.to_path_buf());
    }
    let resolved = cellhost::Interpreter::resolve(Some(Path::new("python3")))
        .context("finding a python interpreter (pass --python PATH)")?;
    Ok(resolved.path().to_path_buf())
}

fn env_count(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!("{name}={v:?} is not a positive integer"),
        },
        _ => Ok(default),
    }
}
