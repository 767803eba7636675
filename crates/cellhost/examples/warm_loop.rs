//! A warm-cell loop for profiling: `cargo run --release --example warm_loop -- [N] [CODE]`.
use std::time::Instant;

use cellhost::{Cell, Kernel, KernelOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20_000);
    let code = args.next().unwrap_or_else(|| "x=1".into());
    let kernel = Kernel::spawn(KernelOptions::default()).await?;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        kernel.execute(Cell::new(code.clone())).await?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{n} cells of {code:?}: p50 {:.1} µs, p99 {:.1} µs",
        times[n / 2],
        times[n * 99 / 100]
    );
    kernel.shutdown().await;
    Ok(())
}
