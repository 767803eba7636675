//! Shared parts of the reliability runs (chaos, load): a real daemon
//! process, a blocking HTTP client, and the chaos run's truth model.

pub mod client;
pub mod daemon;
pub mod model;
pub mod worker;

use std::path::PathBuf;

use anyhow::{Context, Result};

/// The `cellhost` binary: `--cellhost PATH`, else the one built next to
/// this binary (same profile).
pub fn cellhost_bin(arg: Option<PathBuf>) -> Result<PathBuf> {
    match arg {
        Some(p) => Ok(p),
        None => {
            let me = std::env::current_exe()?;
            let bin = me.parent().context("no parent dir")?.join("cellhost");
            anyhow::ensure!(
                bin.exists(),
                "{} is missing: build it (cargo build -p cellhost-cli, same profile) or pass --cellhost PATH",
                bin.display()
            );
            Ok(bin)
        }
    }
}

/// A Prometheus counter's value in `/metrics` text.
pub fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0, |v| v as u64)
}
