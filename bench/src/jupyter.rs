//! The Jupyter peer: jupyter_client + ipykernel, driven by
//! `jupyter_bench.py` in the bench venv and read back as JSON.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::stats::Summary;

/// The script's source, passed with `-c` so the binary needs no files.
const SCRIPT: &str = include_str!("../jupyter_bench.py");

/// Figures reported by `jupyter_bench.py`.
pub struct JupyterFigures {
    /// Python, jupyter_client and ipykernel versions.
    pub versions: Value,
    /// KernelManager start → kernel ready, ms.
    pub cold_start_ms: Summary,
    /// KernelManager start → first `x=1` reply, ms.
    pub cold_first_reply_ms: Summary,
    /// ipykernel process VmRSS after its first cell, KiB.
    pub idle_rss_kib: u64,
    /// Warm `x=1` round trips, µs.
    pub x1_us: Summary,
    /// Warm `print(1)` round trips, µs.
    pub print1_us: Summary,
}

/// Run the Jupyter benchmark with `python` (the venv's interpreter).
pub fn run(python: &Path, n: usize, warmup: usize, cold: usize) -> Result<JupyterFigures> {
    let out = Command::new(python)
        .arg("-c")
        .arg(SCRIPT)
        .args(["--n", &n.to_string()])
        .args(["--warmup", &warmup.to_string()])
        .args(["--cold", &cold.to_string()])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running jupyter_bench.py with {}", python.display()))?;
    if !out.status.success() {
        bail!(
            "jupyter_bench.py exited with {}:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| anyhow!("jupyter_bench.py printed no JSON:\n{stdout}"))?;
    let v: Value = serde_json::from_str(line).context("parsing jupyter_bench.py's JSON")?;
    let summary = |ptr: &str| {
        v.pointer(ptr)
            .and_then(Summary::from_json)
            .ok_or_else(|| anyhow!("jupyter_bench.py JSON lacks {ptr}: {line}"))
    };
    Ok(JupyterFigures {
        versions: v.get("versions").cloned().unwrap_or(Value::Null),
        cold_start_ms: summary("/cold_start_ms")?,
        cold_first_reply_ms: summary("/cold_first_reply_ms")?,
        idle_rss_kib: v
            .get("idle_rss_kib")
            .and_then(Value::as_u64)
            .ok_or_else(|| anyhow!("jupyter_bench.py JSON lacks idle_rss_kib: {line}"))?,
        x1_us: summary("/cells_us/x=1")?,
        print1_us: summary("/cells_us/print(1)")?,
    })
}
