//! cellhost through its public library API: the system under test.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use cellhost::{Cell, CellResult, Kernel, KernelOptions, Status};

use crate::procfs;

/// Spawn one kernel on `python`.
pub async fn spawn(python: &Path) -> Result<Kernel> {
    let opts = KernelOptions::default().python(python);
    Kernel::spawn(opts)
        .await
        .with_context(|| format!("spawning a cellhost kernel on {}", python.display()))
}

/// Run one cell; anything but success is an error.
pub async fn execute(kernel: &Kernel, code: &str) -> Result<CellResult> {
    let result = kernel
        .execute(Cell::new(code))
        .await
        .with_context(|| format!("cellhost: executing {code:?}"))?;
    if result.status != Status::Success {
        bail!(
            "cellhost: {code:?} ended {}: {}",
            result.status.as_str(),
            result.error.as_deref().unwrap_or("(no error text)")
        );
    }
    Ok(result)
}

/// Run `code` `count` times, pushing the wall time of each
/// `kernel.execute(...)` onto `samples` and checking that the cell printed
/// `expect_stdout`.
pub async fn time_cells(
    kernel: &Kernel,
    code: &str,
    expect_stdout: &str,
    count: usize,
    samples: &mut Vec<Duration>,
) -> Result<()> {
    for _ in 0..count {
        let t0 = Instant::now();
        let result = execute(kernel, code).await?;
        samples.push(t0.elapsed());
        if result.stdout != expect_stdout {
            bail!(
                "cellhost: {code:?} printed {:?}, expected {expect_stdout:?}",
                result.stdout
            );
        }
    }
    Ok(())
}

/// What a brand-new kernel costs.
pub struct ColdFigures {
    /// `Kernel::spawn` returning.
    pub spawn: Vec<Duration>,
    /// `Kernel::spawn` → first `x=1` result.
    pub first_reply: Vec<Duration>,
    /// VmRSS of each kernel process after its first cell, KiB.
    pub idle_rss_kib: Vec<u64>,
}

/// Spawn `repeats` kernels one after another, timing each to its first
/// reply and reading its resident size while it sits idle.
pub async fn cold_starts(python: &Path, repeats: usize) -> Result<ColdFigures> {
    let mut figures = ColdFigures {
        spawn: Vec::with_capacity(repeats),
        first_reply: Vec::with_capacity(repeats),
        idle_rss_kib: Vec::with_capacity(repeats),
    };
    for _ in 0..repeats {
        let t0 = Instant::now();
        let kernel = spawn(python).await?;
        figures.spawn.push(t0.elapsed());
        let result = execute(&kernel, "x=1").await?;
        figures.first_reply.push(t0.elapsed());
        let pid = result
            .kernel
            .pid
            .ok_or_else(|| anyhow!("cellhost: a local kernel's result carries no pid"))?;
        figures.idle_rss_kib.push(procfs::vm_rss_kib(pid)?);
        kernel.shutdown().await;
    }
    Ok(figures)
}
