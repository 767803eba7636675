//! `cellhost-bench dialect`: warm `x=1` with the agent's dialect gate
//! (`_has_escapes` before `runner/dialect.py`'s transform) in place,
//! against kernels whose runner skips the gate entirely, as before the
//! transform existed (`CELLHOST_BENCH_NO_DIALECT=1`, which only this bench
//! puts in a kernel's environment), in one run: blocks of cells take turns
//! across several kernels of each variant, so drift and core placement hit
//! both alike. Target: no regression beyond noise.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use cellhost::{Cell, Kernel, KernelOptions};
use serde_json::json;

use crate::library;
use crate::stats::Summary;

const VARIANTS: [&str; 2] = ["dialect", "no-dialect"];
const BLOCK: usize = 100;
const KERNELS_PER_VARIANT: usize = 3;

async fn spawn(variant: &str, python: &Path) -> Result<Kernel> {
    let mut opts = KernelOptions::default().python(python);
    // Both variants get the variable ("0" leaves the gate on), so their
    // environments, and with them the stack's alignment, are the same size.
    let on = if variant == "dialect" { "0" } else { "1" };
    opts.env
        .vars
        .push(("CELLHOST_BENCH_NO_DIALECT".into(), on.into()));
    Kernel::spawn(opts)
        .await
        .with_context(|| format!("spawning a {variant} kernel on {}", python.display()))
}

/// The switch must do what it says, or the ratio means nothing: the
/// dialect's `!echo` runs only with the gate, and cells never see the
/// switch's variable. Checked on a kernel of its own, so the timed ones
/// run nothing but `x=1` (a cell that forks a shell or formats a
/// traceback leaves a runner in a different state).
async fn check(variant: &str, python: &Path) -> Result<()> {
    let kernel = spawn(variant, python).await?;
    let r = kernel
        .execute(Cell::new("!echo hi"))
        .await
        .context("running !echo")?;
    if (r.stdout == "hi\n") != (variant == "dialect") {
        bail!("a {variant} kernel ran `!echo hi` as {r:?}");
    }
    let r = library::execute(
        &kernel,
        "import os; 'CELLHOST_BENCH_NO_DIALECT' in os.environ",
    )
    .await?;
    if r.value.as_deref() != Some("False") {
        bail!("a {variant} kernel's cells see the bench switch: {r:?}");
    }
    kernel.shutdown().await;
    Ok(())
}

pub async fn run(python: &Path, n: usize, warmup: usize, out: &Path) -> Result<()> {
    eprintln!(
        "cellhost-bench dialect: python {}, {n} warm x=1 per variant",
        python.display()
    );
    for name in VARIANTS {
        check(name, python).await?;
    }
    let mut kernels: Vec<(usize, Kernel)> = Vec::new();
    for _ in 0..KERNELS_PER_VARIANT {
        for (v, name) in VARIANTS.iter().enumerate() {
            kernels.push((v, spawn(name, python).await?));
        }
    }
    let mut discard = Vec::new();
    for (_, k) in &kernels {
        library::time_cells(k, "x=1", "", warmup, &mut discard).await?;
    }
    let mut warm: [Vec<Duration>; 2] = Default::default();
    let mut left = n.div_ceil(KERNELS_PER_VARIANT);
    let mut block = 0;
    while left > 0 {
        let count = left.min(BLOCK);
        for j in 0..kernels.len() {
            let (v, k) = &kernels[(block + j) % kernels.len()];
            library::time_cells(k, "x=1", "", count, &mut warm[*v]).await?;
        }
        left -= count;
        block += 1;
    }
    for (_, k) in kernels {
        k.shutdown().await;
    }
    let with = Summary::of(&warm[0]).context("no samples")?;
    let without = Summary::of(&warm[1]).context("no samples")?;
    println!(
        "\n{:<11} {:>12} {:>12}",
        "variant", "warm p50 µs", "warm p95 µs"
    );
    for (name, s) in VARIANTS.iter().zip([&with, &without]) {
        println!("{name:<11} {:>12.1} {:>12.1}", s.p50, s.p95);
    }
    let (r50, r95) = (with.p50 / without.p50, with.p95 / without.p95);
    println!("\ndialect / no-dialect warm x=1: p50 {r50:.3}x, p95 {r95:.3}x");
    let json = json!({
        "python": python,
        "n": n, "warmup": warmup,
        "variants": VARIANTS.iter().zip([&with, &without]).map(|(name, s)| json!({
            "name": name,
            "warm_x1_us": s.to_json(),
        })).collect::<Vec<_>>(),
        "dialect_over_no_dialect_warm_p50": r50,
        "dialect_over_no_dialect_warm_p95": r95,
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(&json)? + "\n")?;
    println!("figures written to {}", out.display());
    Ok(())
}
