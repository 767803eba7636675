//! `cellhost-bench sandbox`: the strict sandbox against plain kernels, in
//! one run. Spawns alternate between the variants; warm cells run in
//! blocks that take turns, so machine drift hits every variant alike.
//!
//! Variants: `plain` (no sandbox, no limits: the path before the
//! sandbox existed), `limits` (no sandbox, default limits: per-kernel
//! cgroups and rlimits), `strict` (bubblewrap + default limits),
//! `strict-rl` (bubblewrap + default limits with rlimits only, no
//! cgroups), and the hardening's two spawn-path layers left out through
//! the library's bench-only switches: `strict-noseccomp` (no seccomp
//! filter) and `strict-hostetc` (the host's `/etc` bound read-only, as
//! before the hardening, instead of the built one); their ratios against
//! `strict` say what seccomp and the built `/etc` cost.
//! Targets: strict warm p50 within 10% of plain; strict spawn at most
//! plain + 15 ms.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cellhost::{Kernel, KernelOptions, ResourceLimits, Sandbox, StrictSandbox};
use serde_json::json;

use crate::library;
use crate::stats::Summary;

const VARIANTS: [&str; 6] = [
    "plain",
    "limits",
    "strict",
    "strict-rl",
    "strict-noseccomp",
    "strict-hostetc",
];
/// The variants compared with `strict` (index 2): what each layer costs.
const LAYERS: [(usize, &str); 2] = [(4, "seccomp"), (5, "built /etc")];
const NV: usize = VARIANTS.len();
const BLOCK: usize = 100;
const KERNELS_PER_VARIANT: usize = 3;

fn options(variant: &str, python: &Path) -> KernelOptions {
    let opts = KernelOptions::default().python(python);
    match variant {
        "plain" => opts.limits(ResourceLimits::unlimited()),
        "limits" => opts,
        "strict" => opts.sandbox(Sandbox::strict()),
        "strict-noseccomp" => opts.sandbox(Sandbox::Strict(
            StrictSandbox::default().bench_without_seccomp(),
        )),
        "strict-hostetc" => opts.sandbox(Sandbox::Strict(
            StrictSandbox::default().bench_with_host_etc(),
        )),
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

/// The bench switches must do what they say, or the ratios mean nothing:
/// the filter's mode in `/proc/self/status` (2: filtering) and whether the
/// host's `/etc/shadow` shows. Run on the untimed first round's kernels.
async fn check(variant: &str, k: &Kernel) -> Result<()> {
    if !variant.starts_with("strict") {
        return Ok(());
    }
    let code = "import os, re; (re.search(r'Seccomp:\\s*(\\d)', open('/proc/self/status').read()).group(1), os.path.exists('/etc/shadow'))";
    let want = match variant {
        "strict-noseccomp" => "('0', False)",
        "strict-hostetc" => "('2', True)",
        _ => "('2', False)",
    };
    let got = library::execute(k, code).await?.value;
    if got.as_deref() != Some(want) {
        anyhow::bail!("a {variant} kernel shows (seccomp mode, host /etc) = {got:?}, not {want}");
    }
    Ok(())
}

pub async fn run(python: &Path, n: usize, warmup: usize, cold: usize, out: &Path) -> Result<()> {
    eprintln!(
        "cellhost-bench sandbox: python {}, {cold} spawns and {n} warm cells per variant",
        python.display()
    );
    // The warm kernels first: alive during the spawns, they hold the
    // built /etc template as a daemon's pool does, so a strict spawn pays
    // the per-kernel part (its generated files), not a template build.
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
    // Spawn → hello, and spawn → first reply, each round in a new random
    // order: with a fixed rotation each variant always followed the same
    // one, whose teardown overlaps the next spawn. A pause after each
    // shutdown lets that teardown finish.
    let mut spawn_t: [Vec<Duration>; NV] = Default::default();
    let mut first_t: [Vec<Duration>; NV] = Default::default();
    let mut rng = XorShift::seeded();
    for i in 0..cold + 1 {
        let mut order: [usize; NV] = std::array::from_fn(|v| v);
        for k in (1..NV).rev() {
            order.swap(k, rng.below(k + 1));
        }
        for v in order {
            let t0 = Instant::now();
            let k = spawn(VARIANTS[v], python).await?;
            let spawned = t0.elapsed();
            library::execute(&k, "x=1").await?;
            let first = t0.elapsed();
            if i == 0 {
                check(VARIANTS[v], &k).await?;
            }
            k.shutdown().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            if i > 0 {
                // The first round warms caches (interpreter, prefixes).
                spawn_t[v].push(spawned);
                first_t[v].push(first);
            }
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
        "\n{:<16} {:>13} {:>17} {:>17} {:>12} {:>9}",
        "variant",
        "spawn p50 ms",
        "1st reply p50 ms",
        "1st reply p95 ms",
        "warm p50 µs",
        "warm p95"
    );
    for v in 0..NV {
        let (sp, fr, w) = (s(&spawn_t[v])?, s(&first_t[v])?, s(&warm[v])?);
        println!(
            "{:<16} {:>13.2} {:>17.2} {:>17.2} {:>12.1} {:>9.1}",
            VARIANTS[v],
            sp.p50 / 1e3,
            fr.p50 / 1e3,
            fr.p95 / 1e3,
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
    // What each hardening layer costs: strict without it against strict
    // (the reference), and strict's extra milliseconds.
    let mut layers = Vec::new();
    for (i, layer) in LAYERS {
        let without = &rows[i];
        let (fr50, fr95) = (without.1.p50 / strict.1.p50, without.1.p95 / strict.1.p95);
        let (w50, w95) = (without.2.p50 / strict.2.p50, without.2.p95 / strict.2.p95);
        let extra_ms = (strict.1.p50 - without.1.p50) / 1e3;
        println!(
            "{} / strict: spawn-to-first-reply p50 {fr50:.3}x p95 {fr95:.3}x; warm x=1 p50 {w50:.3}x p95 {w95:.3}x ({layer} costs {extra_ms:+.2} ms of spawn-to-first-reply p50)",
            VARIANTS[i]
        );
        layers.push(json!({
            "layer": layer,
            "variant": VARIANTS[i],
            "first_reply_p50_ratio": fr50,
            "first_reply_p95_ratio": fr95,
            "warm_p50_ratio": w50,
            "warm_p95_ratio": w95,
            "layer_first_reply_p50_ms": extra_ms,
        }));
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
        "layers_over_strict": layers,
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(&json)? + "\n")?;
    println!("figures written to {}", out.display());
    Ok(())
}

/// A small PRNG for the spawn order (no dependency for a shuffle).
struct XorShift(u64);

impl XorShift {
    fn seeded() -> XorShift {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        XorShift(nanos | 1)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}
