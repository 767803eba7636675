//! The printed table, the ratios against their targets, and the JSON file.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::jupyter::JupyterFigures;
use crate::stats::Summary;

/// cellhost's warm `x=1` p50 may cost at most this many times the raw floor.
pub const MAX_CELLHOST_OVER_RAW: f64 = 1.5;
/// Jupyter's warm `x=1` p50 should cost at least this many times cellhost's.
pub const MIN_JUPYTER_OVER_CELLHOST: f64 = 30.0;

/// Everything one run measured.
pub struct Figures {
    pub python: PathBuf,
    pub python_version: String,
    pub cores: usize,
    pub n: usize,
    pub warmup: usize,
    pub block: usize,
    pub cold: usize,
    pub raw_x1_us: Summary,
    pub raw_print1_us: Summary,
    pub raw_first_reply_ms: Summary,
    pub raw_idle_rss_kib: Summary,
    pub cellhost_x1_us: Summary,
    pub cellhost_print1_us: Summary,
    pub cellhost_spawn_ms: Summary,
    pub cellhost_first_reply_ms: Summary,
    pub cellhost_idle_rss_kib: Summary,
    pub jupyter_n: usize,
    pub jupyter: JupyterFigures,
}

/// One ratio with its target.
struct Ratio {
    value: f64,
    target: f64,
    /// `true`: the ratio must stay at or below the target.
    at_most: bool,
}

impl Ratio {
    fn met(&self) -> bool {
        if self.at_most {
            self.value <= self.target
        } else {
            self.value >= self.target
        }
    }

    fn to_json(&self) -> Value {
        let key = if self.at_most {
            "target_max"
        } else {
            "target_min"
        };
        json!({ "value": round2(self.value), key: self.target, "met": self.met() })
    }
}

impl Figures {
    fn cellhost_over_raw(&self) -> Ratio {
        Ratio {
            value: self.cellhost_x1_us.p50 / self.raw_x1_us.p50,
            target: MAX_CELLHOST_OVER_RAW,
            at_most: true,
        }
    }

    fn jupyter_over_cellhost(&self) -> Ratio {
        Ratio {
            value: self.jupyter.x1_us.p50 / self.cellhost_x1_us.p50,
            target: MIN_JUPYTER_OVER_CELLHOST,
            at_most: false,
        }
    }
}

/// The human-readable report.
pub fn table(f: &Figures) -> String {
    let mut s = String::new();
    let j = &f.jupyter;
    let _ = writeln!(
        s,
        "\ncellhost core benchmark: python {} ({}), {} cores",
        f.python.display(),
        f.python_version,
        f.cores
    );
    let _ = writeln!(
        s,
        "warm loops: N={} per workload after {} warm-up cells; cellhost and raw \
         interleaved in blocks of {}; Jupyter N={}\n",
        f.n, f.warmup, f.block, f.jupyter_n
    );
    let _ = writeln!(
        s,
        "{:<32} {:>10} {:>10} {:>10}",
        "warm cell round trip (µs)", "p50", "p95", "p99"
    );
    let rows = [
        ("raw pipe floor     x=1", &f.raw_x1_us),
        ("raw pipe floor     print(1)", &f.raw_print1_us),
        ("cellhost           x=1", &f.cellhost_x1_us),
        ("cellhost           print(1)", &f.cellhost_print1_us),
        ("jupyter            x=1", &j.x1_us),
        ("jupyter            print(1)", &j.print1_us),
    ];
    for (label, sum) in rows {
        let _ = writeln!(
            s,
            "  {label:<30} {:>10.1} {:>10.1} {:>10.1}",
            sum.p50, sum.p95, sum.p99
        );
    }

    let _ = writeln!(s, "\n{:<32} {:>10} {:>10}", "new kernel (ms)", "p50", "p95");
    let cold_rows = [
        (
            format!("raw runner → 1st reply (×{})", f.cold),
            &f.raw_first_reply_ms,
        ),
        (
            format!("cellhost spawn (×{})", f.cold),
            &f.cellhost_spawn_ms,
        ),
        (
            format!("cellhost → 1st reply (×{})", f.cold),
            &f.cellhost_first_reply_ms,
        ),
        (
            format!("jupyter → ready (×{})", j.cold_start_ms.n),
            &j.cold_start_ms,
        ),
        (
            format!("jupyter → 1st reply (×{})", j.cold_first_reply_ms.n),
            &j.cold_first_reply_ms,
        ),
    ];
    for (label, sum) in cold_rows {
        let _ = writeln!(s, "  {label:<30} {:>10.1} {:>10.1}", sum.p50, sum.p95);
    }

    let _ = writeln!(s, "\nidle RSS after the first cell (MiB)");
    let _ = writeln!(
        s,
        "  {:<30} {:>10.1}",
        "raw runner",
        mib(f.raw_idle_rss_kib.p50)
    );
    let _ = writeln!(
        s,
        "  {:<30} {:>10.1}",
        "cellhost kernel",
        mib(f.cellhost_idle_rss_kib.p50)
    );
    let _ = writeln!(
        s,
        "  {:<30} {:>10.1}",
        "ipykernel",
        mib(j.idle_rss_kib as f64)
    );

    let _ = writeln!(s, "\nratios (warm x=1, p50)");
    let over_raw = f.cellhost_over_raw();
    let _ = writeln!(
        s,
        "  cellhost / raw floor   {:>7.2}x   target <= {}x   {}",
        over_raw.value,
        over_raw.target,
        verdict(&over_raw)
    );
    let over_ch = f.jupyter_over_cellhost();
    let _ = writeln!(
        s,
        "  jupyter / cellhost     {:>7.1}x   target >= {}x    {}",
        over_ch.value,
        over_ch.target,
        verdict(&over_ch)
    );
    let _ = writeln!(
        s,
        "  (print(1): cellhost / raw {:.2}x, jupyter / cellhost {:.1}x)\n",
        f.cellhost_print1_us.p50 / f.raw_print1_us.p50,
        j.print1_us.p50 / f.cellhost_print1_us.p50
    );
    s
}

/// The figures as JSON (bench/results/core.json).
pub fn to_json(f: &Figures) -> Value {
    let j = &f.jupyter;
    let unix_time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    json!({
        "benchmark": "core",
        "unix_time": unix_time,
        "machine": { "cores": f.cores },
        "python": { "path": f.python.display().to_string(), "version": f.python_version },
        "config": {
            "n": f.n,
            "warmup": f.warmup,
            "interleave_block": f.block,
            "cold_repeats": f.cold,
            "jupyter_n": f.jupyter_n,
        },
        "units": { "cells": "µs", "cold": "ms", "rss": "MiB" },
        "raw": {
            "cells": { "x=1": f.raw_x1_us.to_json(), "print(1)": f.raw_print1_us.to_json() },
            "first_reply_ms": f.raw_first_reply_ms.to_json(),
            "idle_rss_mib": round2(mib(f.raw_idle_rss_kib.p50)),
        },
        "cellhost": {
            "cells": {
                "x=1": f.cellhost_x1_us.to_json(),
                "print(1)": f.cellhost_print1_us.to_json(),
            },
            "spawn_ms": f.cellhost_spawn_ms.to_json(),
            "first_reply_ms": f.cellhost_first_reply_ms.to_json(),
            "idle_rss_mib": round2(mib(f.cellhost_idle_rss_kib.p50)),
        },
        "jupyter": {
            "versions": j.versions,
            "cells": { "x=1": j.x1_us.to_json(), "print(1)": j.print1_us.to_json() },
            "cold_start_ms": j.cold_start_ms.to_json(),
            "first_reply_ms": j.cold_first_reply_ms.to_json(),
            "idle_rss_mib": round2(mib(j.idle_rss_kib as f64)),
        },
        "ratios": {
            "cellhost_over_raw_p50": f.cellhost_over_raw().to_json(),
            "jupyter_over_cellhost_p50": f.jupyter_over_cellhost().to_json(),
            "print1_cellhost_over_raw_p50":
                round2(f.cellhost_print1_us.p50 / f.raw_print1_us.p50),
            "print1_jupyter_over_cellhost_p50":
                round2(j.print1_us.p50 / f.cellhost_print1_us.p50),
        },
    })
}

fn verdict(r: &Ratio) -> &'static str {
    if r.met() {
        "met"
    } else {
        "NOT MET"
    }
}

fn mib(kib: f64) -> f64 {
    kib / 1024.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
