//! A new kernel's time to its first reply: `cargo run --release --example cold_start -- [N] [PYTHON]`.
//! Spawns N kernels one after another and times spawn + one `x=1` cell.
use std::time::Instant;

use cellhost::{Cell, Kernel, KernelOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(20);
    let mut opts = KernelOptions::default();
    if let Some(python) = args.next() {
        opts = opts.python(python);
    }
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let kernel = Kernel::spawn(opts.clone()).await?;
        kernel.execute(Cell::new("x=1")).await?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        kernel.shutdown().await;
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{n} new kernels, spawn + first `x=1` reply: p50 {:.1} ms, min {:.1} ms",
        times[n / 2],
        times[0]
    );
    Ok(())
}
