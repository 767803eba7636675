//! `cellhost-bench sandbox`: the strict sandbox against plain kernels, in
//! one run. Spawns alternate between the variants; warm cells run in
//! blocks that take turns, so machine drift hits every variant alike.
//!
//! Variants: `plain` (no sandbox, no limits: the path before the
//! sandbox existed), `limits` (no sandbox, default limits: per-kernel
//! cgroups and rlimits), `strict` (bubblewrap + default limits),
//! `strict-rl` (bubblewrap + default limits with rlimits only, no
//! cgroups).
//! Targets: strict warm p50 within 10% of plain; strict spawn at most
//! plain + 15 ms.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cellhost::{Kernel, KernelOptions, ResourceLimits, Sandbox};
use serde_json::json;

use crate::library;
use crate::stats::Summary;

const VARIANTS: [&str; 4] = ["plain", "limits", "strict", "strict-rl"];
const NV: usize = VARIANTS.len();
const BLOCK: usize = 100;
const KERNELS_PER_VARIANT: usize = 3;

fn options(variant: &str, python: &Path) -> KernelOptions {
    let opts = KernelOptions::default().python(python);
    match variant {
        "plain" => opts.limits(ResourceLimits::unlimited()),
        "limits" => opts,
        "strict" => opts.sandbox(Sandbox::strict()),
        _ => opts
            .sandbox(Sandbox::strict())
            .limits(ResourceLimits::default().cgroups(false)),
    }
}

async fn spawn(variant: &str, python: &Path) -> Result<Kernel> {
    Kernel::spawn(options(variant, python))
        .await
        .with_context(|| format!("spawning a {variant} kernel on {}", python.display()))
}

pub async fn run(python: &Path, n: usize, warmup: usize, cold: usize, out: &Path) -> Result<()> {
    eprintln!(
        "cellhost-bench sandbox: python {}, {cold} spawns and {n} warm cells per variant",
        python.display()
    );
    // Spawn → hello, and spawn → first reply, alternating variants.
    let mut spawn_t: [Vec<Duration>; NV] = Default::default();
    let mut first_t: [Vec<Duration>; NV] = Default::default();
    for i in 0..cold + 1 {
        for j in 0..NV {
            let v = (i + j) % NV;
            let t0 = Instant::now();
            let k = spawn(VARIANTS[v], python).await?;
            let spawned = t0.elapsed();
            library::execute(&k, "x=1").await?;
            let first = t0.elapsed();
            k.shutdown().await;
            if i > 0 {
                // The first round warms caches (interpreter, prefixes).
                spawn_t[v].push(spawned);
                first_t[v].push(first);
            }
        }
    }
    // Warm x=1 round trips, in blocks taking turns. Several kernels per
    // variant: on 2 cores a kernel's round trip depends on whether the
    // scheduler keeps it on the host's core (~21 µs) or not (~90 µs), and
    // one kernel tends to stay in one mode; averaging over a few keeps
    // that placement luck out of the ratios.
    let mut kernels: Vec<(usize, Kernel)> = Vec::new();
    for _ in 0..KERNELS_PER_VARIANT {
        for (v, name) in VARIANTS.iter().enumerate() {
            kernels.push((v, spawn(name, python).await?));
        }
    }
    let mut warm: [Vec<Duration>; NV] = Default::default();
    let mut discard = Vec::new();
    for (_, k) in &kernels {
        library::time_cells(k, "x=1", "", warmup, &mut discard).await?;
    }
    let per_kernel = n.div_ceil(KERNELS_PER_VARIANT);
    let mut left = per_kernel;
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

    let s = |d: &[Duration]| Summary::of(d).context("no samples");
    let mut rows = Vec::new();
    println!(
        "\n{:<8} {:>14} {:>16} {:>14} {:>10}",
        "variant", "spawn p50 ms", "1st reply p50 ms", "warm p50 µs", "warm p95"
    );
    for v in 0..NV {
        let (sp, fr, w) = (s(&spawn_t[v])?, s(&first_t[v])?, s(&warm[v])?);
        println!(
            "{:<8} {:>14.2} {:>16.2} {:>14.1} {:>10.1}",
            VARIANTS[v],
            sp.p50 / 1e3,
            fr.p50 / 1e3,
            w.p50,
            w.p95
        );
        rows.push((sp, fr, w));
    }
    let (plain, strict) = (&rows[0], &rows[2]);
    let warm_ratio = strict.2.p50 / plain.2.p50;
    let spawn_extra_ms = (strict.0.p50 - plain.0.p50) / 1e3;
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    println!(
        "\nstrict / plain warm p50: {warm_ratio:.3}x (target <= 1.10x: {})",
        verdict(warm_ratio <= 1.10)
    );
    println!(
        "strict - plain spawn p50: {spawn_extra_ms:+.2} ms (target <= +15 ms: {})",
        verdict(spawn_extra_ms <= 15.0)
    );
    for (i, name) in VARIANTS.iter().enumerate().skip(1) {
        println!(
            "{name} / plain warm p50: {:.3}x; {name} - plain spawn p50: {:+.2} ms",
            rows[i].2.p50 / plain.2.p50,
            (rows[i].0.p50 - plain.0.p50) / 1e3
        );
    }
    let json = json!({
        "python": python,
        "n": n, "warmup": warmup, "cold": cold,
        "variants": VARIANTS.iter().zip(&rows).map(|(name, (sp, fr, w))| json!({
            "name": name,
            "spawn_ms": sp.scaled(1e-3).to_json(),
            "first_reply_ms": fr.scaled(1e-3).to_json(),
            "warm_x1_us": w.to_json(),
        })).collect::<Vec<_>>(),
        "strict_over_plain_warm_p50": warm_ratio,
        "strict_minus_plain_spawn_p50_ms": spawn_extra_ms,
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(&json)? + "\n")?;
    println!("figures written to {}", out.display());
    Ok(())
}
